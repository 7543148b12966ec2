/* passes/memplan.c: static memory planning, one arena per rank.
 *
 * Needs: the final node order (it is the schedule) and every value typed and shaped.
 * Gives: for every value an arena offset (Value.offset, 64-byte aligned) and its live
 * range [live_start, live_end] in node indices; Graph.arena_bytes, the arena's size.
 *
 * Params, optimizer state, master weights and inputs persist across steps: they sit at
 * the bottom of the arena, live over the whole step. Every other buffer lives from the
 * node that makes it to its last reader (the step's outputs: to the end of the step).
 * A view (OPF_VIEW: reshape, or a value the shard pass placed inside another: a param
 * inside its block's flat buffer, a rank's shard) lies in its root's buffer at a fixed
 * offset (plus a per-rank stride for shards); a root's range covers all its views. Groups are placed largest first, each at the lowest offset that no
 * group with an overlapping live range occupies (best fit would pack no better here and
 * the order makes the plan deterministic).
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

enum { ALIGN = 64 };

typedef struct {
    int root;                 // the value whose buffer this group is
    int64_t bytes, offset;
    int start, end;           // live range, node indices
    int persistent;
} Group;

static int64_t align_up(int64_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

static int persistent_role(Role r)
{
    return r == ROLE_PARAM || r == ROLE_OPT_STATE || r == ROLE_MASTER || r == ROLE_INPUT;
}

/* The value whose buffer v lies in directly: an explicit view (shard pass) or the input
 * of the view op (reshape) that made it; -1 for a buffer of its own. */
static int parent_of(const Graph *g, int v)
{
    const Value *val = ir_value(g, v);
    if (val->view_of >= 0) return val->view_of;
    if (val->producer < 0) return -1;
    const Node *n = ir_node(g, val->producer);
    return (op_info(n->op)->flags & OPF_VIEW) ? ir_in(g, n, 0) : -1;
}

/* Root of each value, and its byte offset and per-rank stride within the root. */
static void find_roots(const Graph *g, int *root, int64_t *at, int64_t *stride)
{
    for (int v = 0; v < g->n_values; v++) root[v] = -2;  // not resolved yet
    for (int v = 0; v < g->n_values; v++) {
        /* Walk up to a resolved ancestor or a root, then resolve the chain back down. */
        int chain[64], n = 0, u = v;
        while (root[u] == -2) {
            FS_ASSERT(n < 64);
            chain[n++] = u;
            int p = parent_of(g, u);
            if (p < 0) {
                root[u] = u, at[u] = stride[u] = 0;
                n--;
                break;
            }
            u = p;
        }
        while (n-- > 0) {
            int w = chain[n], p = parent_of(g, w);
            const Value *wv = ir_value(g, w);
            root[w] = root[p];
            at[w] = at[p] + wv->view_offset;
            stride[w] = stride[p] + wv->view_rank_stride;
        }
    }
}

/* A collective runs on while the ops after it do: its input must stay untouched until
 * the first op that touches its output's buffer, where the runtime waits for it. */
static void hold_collective_inputs(const Graph *g, const int *root, int *end)
{
    for (int n = 0; n < g->n_nodes; n++) {
        const Node *node = ir_node(g, n);
        if (!(op_info(node->op)->flags & OPF_COLLECTIVE)) continue;
        int out = root[ir_out(g, node, 0)], in = root[ir_in(g, node, 0)], first = g->n_nodes;
        for (int m = n + 1; m < g->n_nodes && first == g->n_nodes; m++) {
            const Node *later = ir_node(g, m);
            for (int i = 0; i < later->n_in; i++)
                if (root[ir_in(g, later, i)] == out) first = m;
            for (int i = 0; i < later->n_out; i++)
                if (root[ir_out(g, later, i)] == out) first = m;
        }
        if (first > end[in]) end[in] = first;
    }
}

static void live_ranges(const Graph *g, const int *root, int *start, int *end)
{
    for (int v = 0; v < g->n_values; v++) {
        const Value *val = ir_value(g, v);
        start[v] = end[v] = val->producer >= 0 ? val->producer : 0;
    }
    for (int n = 0; n < g->n_nodes; n++) {
        const Node *node = ir_node(g, n);
        for (int i = 0; i < node->n_in; i++) end[ir_in(g, node, i)] = n;
    }
    for (int i = 0; i < g->n_outputs; i++) end[g->outputs[i]] = g->n_nodes;
    /* A buffer lives as long as anything inside it does. */
    for (int v = 0; v < g->n_values; v++) {
        int r = root[v];
        if (r == v) continue;
        if (start[v] < start[r]) start[r] = start[v];
        if (end[v] > end[r]) end[r] = end[v];
    }
    hold_collective_inputs(g, root, end);
}

static int by_size_desc(const void *a, const void *b)
{
    const Group *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
    if (x->start != y->start) return x->start - y->start;
    return x->root - y->root;
}

static int by_offset(const void *a, const void *b)
{
    const Group *x = *(const Group *const *)a, *y = *(const Group *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The lowest offset >= base where `grp` fits among the placed groups it overlaps. */
static int64_t place(Group *grp, Group *placed, int n_placed, Group **scratch, int64_t base)
{
    int k = 0;
    for (int i = 0; i < n_placed; i++)
        if (placed[i].start <= grp->end && grp->start <= placed[i].end) scratch[k++] = &placed[i];
    qsort(scratch, (size_t)k, sizeof *scratch, by_offset);
    int64_t at = base;
    for (int i = 0; i < k; i++) {
        if (scratch[i]->offset >= at + grp->bytes) break;
        int64_t top = scratch[i]->offset + align_up(scratch[i]->bytes);
        if (top > at) at = top;
    }
    return at;
}

int pass_memplan(Graph *g, const Options *o, Diag *d)
{
    (void)o, (void)d;
    int nv = g->n_values;
    int *root = arena_alloc(g->arena, sizeof(int) * (size_t)nv * 3 + 1);
    int *start = root + nv, *end = start + nv;
    int64_t *at = arena_alloc(g->arena, sizeof(int64_t) * (size_t)nv * 2 + 1), *stride = at + nv;
    find_roots(g, root, at, stride);
    live_ranges(g, root, start, end);

    Group *groups = arena_alloc(g->arena, sizeof(Group) * (size_t)nv + 1);
    int ng = 0;
    for (int v = 0; v < nv; v++) {
        if (root[v] != v) continue;
        const Value *val = ir_value(g, v);
        int pers = persistent_role(val->role);
        groups[ng++] = (Group){v, ir_nbytes(val), 0, pers ? 0 : start[v], pers ? g->n_nodes : end[v], pers};
    }

    /* Persistent state first, in value order: the same layout whatever the activations. */
    int64_t top = 0;
    for (int i = 0; i < ng; i++)
        if (groups[i].persistent) groups[i].offset = top, top += align_up(groups[i].bytes);
    int64_t base = top;

    qsort(groups, (size_t)ng, sizeof *groups, by_size_desc);
    Group *placed = arena_alloc(g->arena, sizeof(Group) * (size_t)ng + 1);
    Group **scratch = arena_alloc(g->arena, sizeof(Group *) * (size_t)ng + 1);
    int n_placed = 0;
    for (int i = 0; i < ng; i++) {
        Group *grp = &groups[i];
        if (grp->persistent) continue;
        grp->offset = place(grp, placed, n_placed, scratch, base);
        placed[n_placed++] = *grp;
        if (grp->offset + align_up(grp->bytes) > top) top = grp->offset + align_up(grp->bytes);
    }

    for (int i = 0; i < ng; i++) {
        Value *val = &g->values[groups[i].root];
        val->offset = groups[i].offset;
        val->live_start = groups[i].start;
        val->live_end = groups[i].end;
    }
    for (int v = 0; v < nv; v++) {
        Value *val = &g->values[v];
        const Value *r = ir_value(g, root[v]);
        val->alias = root[v] == v ? -1 : root[v];
        val->offset = r->offset + at[v];
        val->rank_stride = stride[v];
        val->live_start = r->live_start;
        val->live_end = r->live_end;
    }
    g->arena_bytes = top;
    return 0;
}
