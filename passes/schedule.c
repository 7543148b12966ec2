/* passes/schedule.c: the streams every node runs on and every wait between them, decided
 * once, here, and stored in the plan; the backends execute them as stored and never look
 * for hazards at run time.
 *
 * Needs: the final node order (every pass that adds or moves nodes ran before it; the
 *        fsdp prefetch that moves all-gathers early is still placed by the shard pass).
 * Gives: Node.stream, and Node.wait / n_wait: for each node, the nodes on other streams
 *        it must not start before. memplan reads the waits to keep a collective's buffers
 *        until it is complete.
 *
 * The streams: collectives on STREAM_COLLECTIVE, everything else on STREAM_COMPUTE (the
 * copy stream takes host-device copies once offload makes them). Semantics, the same on
 * every backend: the nodes of one stream run in order; a node on a stream other than
 * compute starts after every compute node before it (its inputs are then made); a compute
 * node starts after the nodes its waits name. At the end of the step every stream is
 * complete.
 *
 * A collective is in flight from its node until the first later node that reads or
 * writes its input or its output: that node waits for it. "Reads or writes" is by buffer
 * (the root every view lies in, as memplan lays them out), not by bytes, so the waits do
 * not depend on offsets. A view op computes nothing (its output lies in its input's
 * bytes), so it never waits. A collective no later node touches is complete at the end
 * of the step; memplan keeps its buffers until then.
 */
#include "passes.h"

/* The buffer a value's bytes lie in: follows views up to the value that owns bytes. */
static int root_of(const Graph *g, int v)
{
    for (int p; (p = ir_view_parent(g, v)) >= 0;) v = p;
    return v;
}

static int is_view_node(const Node *n) { return (op_info(n->op)->flags & OPF_VIEW) != 0; }

/* Whether node n reads or writes a value whose buffer is r0 or r1. */
static int touches(const Graph *g, const Node *n, const int *root, int r0, int r1)
{
    for (int i = 0; i < n->n_in + n->n_out; i++) {
        int r = root[i < n->n_in ? ir_in(g, n, i) : ir_out(g, n, i - n->n_in)];
        if (r == r0 || r == r1) return 1;
    }
    return 0;
}

static void add_wait(Graph *g, Node *n, int on)
{
    g->waits = arena_grow(g->arena, g->waits, &g->cap_waits, g->n_waits + 1, sizeof *g->waits);
    if (!n->n_wait) n->wait = g->n_waits;
    FS_ASSERT(n->wait + n->n_wait == g->n_waits);  // a node's waits are added together
    g->waits[g->n_waits++] = on;
    n->n_wait++;
}

int pass_schedule(Graph *g, const Options *o, Diag *d)
{
    (void)o, (void)d;
    int *root = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_values + 1);
    for (int v = 0; v < g->n_values; v++) root[v] = root_of(g, v);
    int *pending = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_nodes + 1), n_pending = 0;
    g->n_waits = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        Node *n = &g->nodes[k];
        int coll = (op_info(n->op)->flags & OPF_COLLECTIVE) != 0;
        n->stream = coll ? STREAM_COLLECTIVE : STREAM_COMPUTE;
        n->wait = n->n_wait = 0;
        if (is_view_node(n)) continue;
        /* In flight, in the order they started: a node waits for them in that order. */
        int kept = 0;
        for (int j = 0; j < n_pending; j++) {
            const Node *c = ir_node(g, pending[j]);
            if (touches(g, n, root, root[ir_in(g, c, 0)], root[ir_out(g, c, 0)]))
                add_wait(g, n, pending[j]);
            else
                pending[kept++] = pending[j];
        }
        n_pending = kept;
        if (coll) pending[n_pending++] = k;
    }
    return 0;
}
