/* passes/fold.c: layout copies that their reader can read in place.
 *
 * Needs: the forward graph from lower. Gives: a matmul whose operand is a transpose of
 *        the last two dims of a tensor reads that tensor itself, with the matmul's own
 *        ta / tb flag (a GEMM's transposed operand) flipped instead; the transpose, now
 *        read by nothing, goes with dce, which runs next. GPT-2's tied output layer
 *        (x @ transpose(wte)) then reads wte in place: no V x C copy in the forward,
 *        and the backward's gradient of wte comes out [V, C], with no transpose back.
 *        The GEMM computes the same products; whether its sums come out bit for bit
 *        as with the copy depends on the BLAS kernel (they do with the OpenBLAS the
 *        tests ran on), so nothing relies on it: the parity tests hold PyTorch's
 *        tolerance.
 */
#include <string.h>

#include "passes.h"

/* The tensor whose last two dims transpose v swaps, or -1. */
static int transposed_from(const Graph *g, int v)
{
    int n = ir_value(g, v)->producer;
    if (n < 0 || g->nodes[n].op != OP_transpose) return -1;
    const Node *t = ir_node(g, n);
    int x = ir_in(g, t, 0), r = ir_value(g, x)->rank;
    int64_t a = ir_attr_int(g, t, "a", -2), b = ir_attr_int(g, t, "b", -1);
    if (a < 0) a += r;
    if (b < 0) b += r;
    int last_two = r >= 2 && ((a == r - 2 && b == r - 1) || (a == r - 1 && b == r - 2));
    return last_two ? x : -1;
}

/* Replaces matmul n by one that reads the transposes' inputs; the new node's id. */
static int fold_matmul(Graph *g, int n, int x0, int x1)
{
    const Node *m = ir_node(g, n);
    int in[2] = {x0 >= 0 ? x0 : ir_in(g, m, 0), x1 >= 0 ? x1 : ir_in(g, m, 1)};
    int ta = (int)ir_attr_int(g, m, "ta", 0) ^ (x0 >= 0), tb = (int)ir_attr_int(g, m, "tb", 0) ^ (x1 >= 0);
    Attr attrs[2] = {{.key = "ta", .kind = ATTR_INT, .i = ta}, {.key = "tb", .kind = ATTR_INT, .i = tb}};
    char err[256];
    int c = ir_node_add(g, OP_matmul, in, 2, attrs, 2, m->block, m->phase, m->loc, err, sizeof err);
    FS_ASSERT(c >= 0);
    int old = ir_out(g, ir_node(g, n), 0), now = ir_out(g, ir_node(g, c), 0);
    g->values[now].name = g->values[old].name;
    g->values[now].loc = g->values[old].loc;
    for (int k = 0; k < g->n_nodes; k++)
        for (int i = 0; i < g->nodes[k].n_in; i++)
            if (g->ids[g->nodes[k].in + i] == old) g->ids[g->nodes[k].in + i] = now;
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == old) g->outputs[i] = now;
    return c;
}

int pass_fold(Graph *g, const Options *o, Diag *d)
{
    (void)o, (void)d;
    int n_orig = g->n_nodes;
    int *replaced = arena_alloc(g->arena, sizeof(int) * (size_t)n_orig + 1);
    for (int n = 0; n < n_orig; n++) {
        replaced[n] = -1;
        if (g->nodes[n].op != OP_matmul) continue;
        const Node *m = ir_node(g, n);
        int x0 = transposed_from(g, ir_in(g, m, 0)), x1 = transposed_from(g, ir_in(g, m, 1));
        if (x0 >= 0 || x1 >= 0) replaced[n] = fold_matmul(g, n, x0, x1);
    }
    if (g->n_nodes == n_orig) return 0;
    /* Each new matmul where the one it replaces was (that one, read by nothing now, after it). */
    int *order = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_nodes);
    int k = 0;
    for (int n = 0; n < n_orig; n++) {
        if (replaced[n] >= 0) order[k++] = replaced[n];
        order[k++] = n;
    }
    FS_ASSERT(k == g->n_nodes);
    ir_nodes_reorder(g, order);
    return 0;
}
