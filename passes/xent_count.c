/* passes/xent_count.c: a loss with an ignore_index is the mean over the targets it counts
 * in the step's whole global batch, whatever the strategy (DESIGN.md invariant 1).
 *
 * cross_entropy(..., ignore_index = N) divides by the rows of its own micro-batch that
 * count. The step then averages its M micro-batches (passes/pipeline.c: 1/M seeds each)
 * and its D data-parallel ranks (the shard pass's averages, gradsum's proof), as DDP with
 * accumulation does: the global batch's mean only when every part counts as many targets,
 * which masked-LM data never does. Here each part's loss is scaled by its share,
 *   loss_m' = loss_m * c_m * D M / max(N, 1),   N = the sum of every c_m over every rank,
 * so the M x D mean of the loss_m' is sum(terms) / N, the single-rank run's loss; and the
 * gradient of loss_m (its backward's dloss, which ir/grad.c divided by c_m: per_row)
 * gets dloss * D M / max(N, 1) instead, the same scaling with c_m cancelled. A part that
 * counts nothing has loss 0 (ops.h) and scale 0; a step that counts nothing has loss 0
 * and gradient 0, never 0/0.
 *
 * Needs: the micro-batches unrolled in their order (pipeline ran; its Node.mb) and the
 *        backward of each loss as ir/grad.c makes it, target_count -> div -> bwd (xent,
 *        which fuses it, runs after). D = the stage's data-parallel ranks, M the
 *        micro-batches; nothing to do when D M = 1.
 * Gives: at the start of the step, before any backward (the step's own nodes, mb -1):
 *        the nodes that make each micro-batch's targets (from the data inputs alone:
 *        their slices, moved up from the micro-batches), a target_count of each, their
 *        sum, its all-reduce over the data-parallel group (a sum, no average: a count,
 *        not a gradient, so gradsum's proof of the gradients is untouched) and the
 *        scales; after each loss the scaled loss, which every reader of the loss reads;
 *        each backward's dloss scaled. Forward-only programs (evaluation over D ranks)
 *        run it too, so their loss is the global mean as well. Pipelines: the last stage
 *        holds the loss, its targets and its count; the others have none of it.
 */
#include <string.h>

#include "passes.h"

typedef struct {
    Graph *g;
    Diag *d;
    int *after;   // per node: the new node placed right after it, or -1
    int *instead; // per node: the new node placed in its place (it is dropped), or -1
    char *drop;   // per node: removed at the end
    char *early;  // per node: runs at the start of the step (the targets' makers, the counts)
    char *scaled; // per node: a cross_entropy_bwd whose dloss is scaled
    int *early_new, n_early_new;  // new nodes at the start, in order
} Count;

static int add(Count *c, OpKind op, const int *in, int n_in, const Attr *at, int n_at, Phase ph, Loc loc)
{
    char err[256];
    int n = ir_node_add(c->g, op, in, n_in, at, n_at, -1, ph, loc, err, sizeof err);
    if (n < 0) fprintf(stderr, "xent_count: %s\n", err);
    FS_ASSERT(n >= 0);
    c->g->nodes[n].mb = -1;
    return n;
}

static int out0(Count *c, int n) { return ir_out(c->g, ir_node(c->g, n), 0); }

/* A node at the start of the step: its output. */
static int early(Count *c, OpKind op, const int *in, int n_in, const Attr *at, int n_at, Phase ph, Loc loc)
{
    int n = add(c, op, in, n_in, at, n_at, ph, loc);
    c->early_new[c->n_early_new++] = n;
    return out0(c, n);
}

static int scalar(Count *c, double v, Loc loc)
{
    Attr a = {.key = "value", .kind = ATTR_FLOAT, .f = v};
    return early(c, OP_scalar, NULL, 0, &a, 1, PHASE_FORWARD, loc);
}

/* Marks the nodes value v is made by (v itself and what it reads, back to the data
 * inputs) to run at the start; 0, or -1 (an error at loc) when one reads a param or
 * another stage's value: then the targets exist only inside a micro-batch. */
static int hoist(Count *c, int v, Loc loc)
{
    const Value *val = ir_value(c->g, v);
    if (val->producer < 0) {
        if (val->role == ROLE_INPUT || val->role == ROLE_CONST) return 0;
        diag_error(c->d, loc, "cross_entropy: with an ignore_index over several micro-batches or data-parallel ranks "
                   "the step counts the targets before any backward, so they must come from the model's inputs "
                   "alone; these read '%s'", val->name ? val->name : "a param");
        return -1;
    }
    const Node *n = ir_node(c->g, val->producer);
    if (c->early[val->producer]) return 0;
    if (n->op == OP_recv) {
        diag_error(c->d, loc, "cross_entropy: with an ignore_index over several micro-batches or data-parallel ranks "
                   "the targets must be on the loss's stage (a model input there), not received from another");
        return -1;
    }
    c->early[val->producer] = 1;
    for (int i = 0; i < n->n_in; i++)
        if (hoist(c, ir_in(c->g, n, i), loc)) return -1;
    return 0;
}

/* The losses of one cross_entropy of the source: loss[m] is micro-batch m's node. Their
 * step count N, the scale k / max(N, 1) (k = D M) at the start, and the rewrite. */
static int rescale(Count *c, const int *loss, int M, int D, int64_t ignore)
{
    Graph *g = c->g;
    Loc loc = ir_node(g, loss[0])->loc;
    Attr ig = {.key = "ignore_index", .kind = ATTR_INT, .i = ignore};
    int *count = arena_alloc(g->arena, sizeof(int) * (size_t)M), sum = -1;
    for (int m = 0; m < M; m++) {
        int t = ir_in(g, ir_node(g, loss[m]), 1);
        if (hoist(c, t, loc)) return -1;
        count[m] = early(c, OP_target_count, &t, 1, &ig, 1, PHASE_FORWARD, loc);
        g->values[count[m]].name = arena_printf(g->arena, "targets_counted.mb%d", m);
        sum = sum < 0 ? count[m] : early(c, OP_add, (int[]){sum, count[m]}, 2, NULL, 0, PHASE_FORWARD, loc);
    }
    if (D > 1) {
        Attr at[3] = {{.key = "world", .kind = ATTR_INT, .i = D}, {.key = "avg", .kind = ATTR_INT, .i = 0},
                      {.key = "group", .kind = ATTR_INT, .i = OP_GROUP_DATA}};
        sum = early(c, OP_all_reduce, &sum, 1, at, 3, PHASE_COMM, loc);
    }
    g->values[sum].name = "targets_counted";
    /* max(N, 1) = relu(N - 1) + 1 for a count N >= 0: an all-ignored step divides by 1 */
    int one = scalar(c, 1, loc);
    int floor1 = early(c, OP_sub, (int[]){sum, one}, 2, NULL, 0, PHASE_FORWARD, loc);
    floor1 = early(c, OP_relu, &floor1, 1, NULL, 0, PHASE_FORWARD, loc);
    floor1 = early(c, OP_add, (int[]){floor1, one}, 2, NULL, 0, PHASE_FORWARD, loc);
    int k = early(c, OP_div, (int[]){scalar(c, (double)D * M, loc), floor1}, 2, NULL, 0, PHASE_FORWARD, loc);
    g->values[k].name = "loss_scale_per_row";
    for (int m = 0; m < M; m++) {
        int share = early(c, OP_mul, (int[]){count[m], k}, 2, NULL, 0, PHASE_FORWARD, loc);
        const Node *ln = ir_node(g, loss[m]);
        int own = ir_out(g, ln, 0), t = ir_in(g, ln, 1);
        int n = add(c, OP_mul, (int[]){own, share}, 2, NULL, 0, ln->phase, ln->loc);
        g->nodes[n].mb = ln->mb, g->nodes[n].chunk = ln->chunk, g->nodes[n].block = ln->block;
        int scaled = out0(c, n);
        ir_value_take_over(g, own, scaled);  // every reader of the loss, the step's output too ...
        g->ids[ir_node(g, n)->in] = own;     // ... but the scaling itself
        const char *name = g->values[scaled].name ? g->values[scaled].name : "loss";
        g->values[own].name = arena_printf(g->arena, "%s.own_mean", name);
        g->values[own].step_role = SR_NONE, g->values[own].role = ROLE_ACT;
        c->after[loss[m]] = n;
        /* its backward: cross_entropy_bwd(.., div(dloss, target_count(t)), per_row) -> dloss * k */
        for (int b = 0; b < g->n_nodes; b++) {
            const Node *bw = ir_node(g, b);
            if (bw->op != OP_cross_entropy_bwd || c->scaled[b] || ir_in(g, bw, 1) != t ||
                ir_attr_int(g, bw, "ignore_index", OPS_NO_IGNORE) != ignore)
                continue;  // (a second loss on the same targets: its backward is scaled already, by the same k)
            int dv = ir_value(g, ir_in(g, bw, 2))->producer;
            const Node *dn = dv >= 0 ? ir_node(g, dv) : NULL;
            int cn = dn && dn->op == OP_div ? ir_value(g, ir_in(g, dn, 1))->producer : -1;
            // ir/grad.c's form
            FS_ASSERT(ir_attr_int(g, bw, "per_row", 0) && cn >= 0 && ir_node(g, cn)->op == OP_target_count);
            c->scaled[b] = 1;
            int x = ir_in(g, dn, 0), phase = dn->phase, mb = dn->mb, chunk = dn->chunk;
            int r = add(c, OP_mul, (int[]){x, k}, 2, NULL, 0, (Phase)phase, dn->loc);
            g->nodes[r].mb = mb, g->nodes[r].chunk = chunk;
            ir_value_take_over(g, ir_out(g, ir_node(g, dv), 0), out0(c, r));
            c->instead[dv] = r;
            c->drop[dv] = c->drop[cn] = 1;
        }
    }
    return 0;
}

int pass_xent_count(Graph *g, const Options *o, Diag *d)
{
    int D = o->train.world > 1 ? o->train.world : 1, M = o->train.microbatches > 1 ? o->train.microbatches : 1;
    if ((int64_t)D * M <= 1) return 0;
    int n_orig = g->n_nodes, n_loss = 0;
    int *loss = arena_alloc(g->arena, sizeof(int) * (size_t)n_orig + 1);
    int *seen = arena_alloc(g->arena, sizeof(int) * (size_t)M);
    memset(seen, 0, sizeof(int) * (size_t)M);
    for (int n = 0; n < n_orig; n++) {  // the losses in order: micro-batch m's j-th is its j-th of the source
        const Node *x = ir_node(g, n);
        if (x->op != OP_cross_entropy || x->phase != PHASE_FORWARD ||
            !ops_ignores(ir_attr_int(g, x, "ignore_index", OPS_NO_IGNORE)))
            continue;
        int m = M > 1 ? x->mb : 0;
        FS_ASSERT(m >= 0 && m < M);
        loss[(size_t)seen[m]++ * (size_t)M + (size_t)m] = n;
        n_loss++;
    }
    if (!n_loss) return 0;
    for (int m = 0; m < M; m++) FS_ASSERT(seen[m] == seen[0]);  // every micro-batch is a copy of one
    size_t most = (size_t)n_orig + (size_t)n_loss * 16 + 64;  // the nodes this pass adds, at most
    Count c = {.g = g, .d = d, .after = arena_alloc(g->arena, sizeof(int) * most),
               .instead = arena_alloc(g->arena, sizeof(int) * most), .drop = arena_alloc(g->arena, most),
               .early = arena_alloc(g->arena, most), .scaled = arena_alloc(g->arena, most),
               .early_new = arena_alloc(g->arena, sizeof(int) * most)};
    memset(c.after, -1, sizeof(int) * most), memset(c.instead, -1, sizeof(int) * most);
    memset(c.drop, 0, most), memset(c.early, 0, most), memset(c.scaled, 0, most);
    for (int j = 0; j < seen[0]; j++)
        if (rescale(&c, &loss[(size_t)j * (size_t)M], M, D,
                    ir_attr_int(g, ir_node(g, loss[(size_t)j * (size_t)M]), "ignore_index", OPS_NO_IGNORE)))
            return -1;
    FS_ASSERT((size_t)g->n_nodes <= most);
    for (int b = 0; b < g->n_nodes; b++)  // a backward whose loss it did not find would be a part's mean: say so
        if (g->nodes[b].op == OP_cross_entropy_bwd && !c.scaled[b] &&
            ops_ignores(ir_attr_int(g, ir_node(g, b), "ignore_index", OPS_NO_IGNORE))) {
            diag_error(d, g->nodes[b].loc, "internal error: xent_count: the backward of a loss with an ignore_index "
                       "reads targets no forward loss of a micro-batch reads; its gradient would not be the global "
                       "batch's mean");
            return -1;
        }
    /* The targets' makers (in their order), the counts and scales, then every other node
     * in its order with the scaled losses after the losses and the backward's scaled
     * dloss in place of its division; the divisions and their counts last, dropped. */
    int *order = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_nodes + 1), k = 0;
    char *placed = arena_alloc(g->arena, (size_t)g->n_nodes + 1);
    memset(placed, 0, (size_t)g->n_nodes);
    for (int n = 0; n < n_orig; n++)
        if (c.early[n]) order[k++] = n, placed[n] = 1, g->nodes[n].mb = -1;
    for (int i = 0; i < c.n_early_new; i++) order[k++] = c.early_new[i], placed[c.early_new[i]] = 1;
    for (int n = 0; n < n_orig; n++) {
        if (placed[n] || (c.drop[n] && c.instead[n] < 0)) continue;
        order[k++] = c.instead[n] >= 0 ? c.instead[n] : n;
        if (c.after[n] >= 0) order[k++] = c.after[n];
    }
    char *drop = arena_alloc(g->arena, (size_t)g->n_nodes + 1);
    memset(drop, 0, (size_t)g->n_nodes);
    for (int n = 0; n < n_orig; n++)
        if (c.drop[n]) drop[k] = 1, order[k++] = n;
    FS_ASSERT(k == g->n_nodes);
    ir_nodes_reorder(g, order);
    ir_graph_compact(g, drop);
    return d->n_errors ? -1 : 0;
}
