/* passes/dce.c: dead-code elimination. Keeps the nodes that an output depends on and
 * compacts the graph (ir_graph_compact), renumbering values and nodes in their order.
 * Params and inputs always stay (they are part of the model's state and of the data
 * contract); one that no output uses gets a warning, as DDP users expect. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* Marks live nodes by walking back from the outputs; nodes come in topological order. */
static void mark(const Graph *g, char *live_node, char *live_val)
{
    for (int i = 0; i < g->n_outputs; i++) live_val[g->outputs[i]] = 1;
    for (int n = g->n_nodes - 1; n >= 0; n--) {
        const Node *node = ir_node(g, n);
        for (int k = 0; k < node->n_out && !live_node[n]; k++) live_node[n] = live_val[ir_out(g, node, k)];
        if (!live_node[n]) continue;
        for (int k = 0; k < node->n_out; k++) live_val[ir_out(g, node, k)] = 1;
        for (int k = 0; k < node->n_in; k++) live_val[ir_in(g, node, k)] = 1;
    }
}

static void warn_unused(const Graph *g, const char *live_val, Diag *d)
{
    for (int v = 0; v < g->n_values; v++) {
        const Value *val = ir_value(g, v);
        if (live_val[v] || (val->role != ROLE_PARAM && val->role != ROLE_INPUT) || val->step_role != SR_NONE)
            continue;  // the runtime's own inputs (dropout's rng, unread in evaluation) are not the model's
        diag_warning(d, val->loc, "%s '%s' is never used by the loss or an output%s", role_name(val->role),
                     val->name ? val->name : "?", val->role == ROLE_PARAM ? "; it will get no gradient" : "");
    }
}

int pass_dce(Graph *g, const Options *o, Diag *d)
{
    (void)o;
    char *live_node = arena_alloc(g->arena, (size_t)g->n_nodes + 1);
    char *live_val = arena_alloc(g->arena, (size_t)g->n_values + 1);
    mark(g, live_node, live_val);
    warn_unused(g, live_val, d);
    /* Params, inputs and constants stay: compaction drops only dead nodes' outputs. */
    char *dead_node = arena_alloc(g->arena, (size_t)g->n_nodes + 1);
    for (int n = 0; n < g->n_nodes; n++) dead_node[n] = !live_node[n];
    ir_graph_compact(g, dead_node);
    return 0;
}
