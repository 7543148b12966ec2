/* passes/pad_vocab.c: a vocabulary the tensor cores like. A classifier over an odd
 * vocabulary (GPT-2's 50257) gives its GEMMs an odd n and odd leading dimensions; llm.c pads
 * it to 50304. Here the param that makes the logits' vocabulary dimension gets padding rows
 * appended, up to a multiple of the `pad_vocab` setting: its stored shape is [Vp, C], its
 * model's own [V, C] (Value.logical_rows = V), so its V x C logical elements keep their
 * row-major index (parameter init, checkpoints, --save-weights and Hugging Face files see
 * the logical tensor, the first V x C elements). The loss gets a `valid` attribute, V: the
 * padded logits are -inf to it (no probability, zero gradient).
 *
 * Why the padding stays zero: init makes it zero (runtime/init.c: elements past the
 * logical ones), the embedding never reads a padding row (a token is below V), and the
 * head's gradient rows there are dlogits' padded columns, exactly 0, so the whole
 * gradient row is 0; AdamW's and SGD's update of a zero param with a zero gradient (and
 * zero state) is zero, weight decay included.
 *
 * Needs: a forward graph after fold and dce (the head reads the param through matmul's tb
 *        flag; no dead transpose reads it); the `pad_vocab` setting (64 by default; 0: off).
 * Gives: for each cross_entropy whose logits [..., V] (V not a multiple of pad_vocab) a
 *        matmul makes from a param P [V, C] read transposed (tb: GPT-2's tied wte, or an
 *        untied head stored [V, C]), where P is read only by that matmul and as an
 *        embedding's table, and the logits only by the loss (or as an output of the step:
 *        the sampling program's): P widened to [Vp, C], every node's outputs retyped (the
 *        logits [..., Vp]), and the loss replaced by one with valid = V. Logits that add a
 *        bias b [V] to that matmul (BERT's decoder: h @ transpose(word_emb) + bias), b read
 *        by nothing else, get b widened to [Vp] too: its padding is zero as P's is (init,
 *        and its gradient there is the sum of dlogits' padded columns, 0). A head stored
 *        [C, V] (read without tb: Llama's output) keeps its shape, as padding its columns
 *        would move every logical element: where the logits are read by the loss alone (no
 *        output of the step), the head matmul reads pad(P) [C, Vp], P's columns and zeros,
 *        made just before it (its gradient, slice, drops the padding's), and the loss gets
 *        valid = V; the model state, its files and the params count are untouched, at the
 *        cost of the copy (and its gradient's slice) each step. Forward-only programs run
 *        it too, so evaluation, sampling and decode read the same stored param; the decode
 *        program, which has no loss, pads the [V, C] head that makes its output logits (read
 *        by nothing); a [C, V] head's sampling and decode programs read the param as it is.
 *        A [C, V] head with a bias (a classifier's) is not padded: its bias would need a
 *        padded copy each step as well, which is not built.
 */
#include <string.h>

#include "passes.h"

/* Whether param p is read only by node `head` (as its B operand) and as an embedding's table. */
static int only_head_and_table(const Graph *g, int p, int head)
{
    for (int k = 0; k < g->n_nodes; k++) {
        const Node *n = ir_node(g, k);
        for (int i = 0; i < n->n_in; i++) {
            if (ir_in(g, n, i) != p) continue;
            if (!(k == head && i == 1) && !(n->op == OP_embedding && i == 0)) return 0;
        }
    }
    return 1;
}

/* Whether value v is read by node `only` and no other (an output of the step may be it). */
static int read_only_by(const Graph *g, int v, int only)
{
    for (int k = 0; k < g->n_nodes; k++)
        for (int i = 0; k != only && i < g->nodes[k].n_in; i++)
            if (ir_in(g, ir_node(g, k), i) == v) return 0;
    return 1;
}

/* The bias b [V] of logits L = M + b (BERT's decoder bias), or -1 (then M is L: logits
 * without a bias): the add that makes L reads a matmul's output M [..., V] that nothing
 * else reads, and a param b that nothing else reads. */
static int head_bias(const Graph *g, int L, int *M)
{
    *M = L;
    const Value *lv = ir_value(g, L);
    int a = lv->producer;
    if (ir_node(g, a)->op != OP_add) return -1;
    for (int i = 0; i < 2; i++) {
        int m = ir_in(g, ir_node(g, a), i), b = ir_in(g, ir_node(g, a), 1 - i);
        const Value *mv = ir_value(g, m), *bv = ir_value(g, b);
        if (mv->producer < 0 || ir_node(g, mv->producer)->op != OP_matmul || mv->rank != lv->rank ||
            mv->shape[mv->rank - 1] != lv->shape[lv->rank - 1] || !read_only_by(g, m, a))
            continue;
        if (bv->role != ROLE_PARAM || bv->tied_to >= 0 || bv->rank != 1 || bv->shape[0] != lv->shape[lv->rank - 1] ||
            bv->logical_rows || !read_only_by(g, b, a))
            continue;
        *M = m;
        return b;
    }
    return -1;
}

/* The param the vocabulary of logits L comes from, or -1 when it cannot be padded; n is
 * the loss node that reads L, or -1 for logits nothing reads (the decode program's output).
 * *bias is the logits' bias param, padded with it, or -1. */
static int head_param(const Graph *g, int L, int n, int64_t multiple, int *bias)
{
    const Value *lv = ir_value(g, L);
    *bias = -1;
    if (lv->rank < 1) return -1;
    int64_t V = lv->shape[lv->rank - 1];
    if (V % multiple == 0 || lv->producer < 0 || !read_only_by(g, L, n)) return -1;
    int M, b = head_bias(g, L, &M);
    const Node *mm = ir_node(g, ir_value(g, M)->producer);
    if (mm->op != OP_matmul || !ir_attr_int(g, mm, "tb", 0)) return -1;
    int p = ir_in(g, mm, 1);
    const Value *pv = ir_value(g, p);
    if (pv->role != ROLE_PARAM || pv->tied_to >= 0 || pv->rank != 2 || pv->shape[0] != V || pv->logical_rows) return -1;
    if (!only_head_and_table(g, p, ir_value(g, M)->producer)) return -1;
    *bias = b;
    return p;
}

/* The loss node n again, its attributes (an ignore_index) and valid = V, where n was; n dropped. */
static void mask_loss(Graph *g, int n, int64_t V)
{
    const Node *x = ir_node(g, n);
    int in[2] = {ir_in(g, x, 0), ir_in(g, x, 1)};
    Attr at[IR_MAX_PARAMS + 1];
    int n_at = ir_node_attrs(g, x, at), at_valid = 0;
    while (at_valid < n_at && strcmp(at[at_valid].key, "valid")) at_valid++;  // lower may have written the default, 0
    at[at_valid] = (Attr){.key = "valid", .kind = ATTR_INT, .i = V};
    n_at += at_valid == n_at;
    char err[256];
    int f = ir_node_add(g, OP_cross_entropy, in, 2, at, n_at, x->block, x->phase, x->loc, err, sizeof err);
    FS_ASSERT(f >= 0);
    g->nodes[f].mb = g->nodes[n].mb, g->nodes[f].chunk = g->nodes[n].chunk;
    x = ir_node(g, n);
    for (int o = 0; o < 2; o++) ir_value_take_over(g, ir_out(g, x, o), ir_out(g, ir_node(g, f), o));
    int *order = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_nodes);
    int k = 0;
    for (int i = 0; i < f; i++) order[k++] = i == n ? f : i;
    order[k++] = n;
    ir_nodes_reorder(g, order);
    ir_graph_drop_last(g, 1);
}

/* The matmul that makes logits L from a head stored [C, V] (read without tb: Llama's output), where L is read
 * only by the loss n and is no output of the step, V not a multiple of m; or -1. */
static int column_head(const Graph *g, int L, int n, int64_t m)
{
    const Value *lv = ir_value(g, L);
    if (lv->rank < 1 || lv->shape[lv->rank - 1] % m == 0 || lv->producer < 0 || !read_only_by(g, L, n)) return -1;
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == L) return -1;
    const Node *mm = ir_node(g, lv->producer);
    if (mm->op != OP_matmul || ir_attr_int(g, mm, "tb", 0)) return -1;
    const Value *pv = ir_value(g, ir_in(g, mm, 1));
    return pv->role == ROLE_PARAM && pv->rank == 2 && pv->shape[1] == lv->shape[lv->rank - 1] ? lv->producer : -1;
}

/* Head matmul mm reads pad(P) [C, Vp], P's columns and zeros up to a multiple of m, made just before it. */
static void pad_columns(Graph *g, int mm, int64_t m)
{
    const Node *x = ir_node(g, mm);
    int p = ir_in(g, x, 1);
    int64_t V = ir_value(g, p)->shape[1];
    Attr at[3] = {{.key = "axis", .kind = ATTR_INT, .i = 1}, {.key = "start", .kind = ATTR_INT, .i = 0},
                  {.key = "size", .kind = ATTR_INT, .i = (V + m - 1) / m * m}};
    char err[256];
    int f = ir_node_add(g, OP_pad, &p, 1, at, 3, x->block, x->phase, x->loc, err, sizeof err);
    FS_ASSERT(f >= 0);
    g->nodes[f].mb = g->nodes[mm].mb, g->nodes[f].chunk = g->nodes[mm].chunk, g->nodes[f].use = g->nodes[mm].use;
    g->ids[g->nodes[mm].in + 1] = ir_out(g, ir_node(g, f), 0);
    int *order = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_nodes), k = 0;
    for (int i = 0; i < f; i++) {
        if (i == mm) order[k++] = f;
        order[k++] = i;
    }
    ir_nodes_reorder(g, order);
}

/* Param p widened to a multiple of m rows, its own kept in logical_rows. */
static void widen(Graph *g, int p, int64_t m)
{
    Value *pv = &g->values[p];
    pv->logical_rows = pv->shape[0];
    pv->shape[0] = (pv->shape[0] + m - 1) / m * m;
}

int pass_pad_vocab(Graph *g, const Options *o, Diag *d)
{
    int64_t m = o->train.pad_vocab;
    if (m <= 1) return 0;
    int padded = 0, losses = 0;
    for (int n = 0; n < g->n_nodes; n++) {
        if (g->nodes[n].op != OP_cross_entropy) continue;
        losses++;
        if (ir_attr_int(g, ir_node(g, n), "valid", 0)) continue;
        int L = ir_in(g, ir_node(g, n), 0);
        int64_t V = ir_value(g, L)->shape[ir_value(g, L)->rank - 1];
        int b, p = head_param(g, L, n, m, &b), mm = p < 0 ? column_head(g, L, n, m) : -1;
        if (p < 0 && mm < 0) continue;
        if (p >= 0) widen(g, p, m);
        if (b >= 0) widen(g, b, m);
        if (mm >= 0) pad_columns(g, mm, m), n++;  // the pad comes before the loss
        mask_loss(g, n, V);
        padded = 1;
    }
    /* The decode program has no loss: its logits, the output, padded as the sampling program's
     * are (the sampler reads the model's own columns of either: the padded param's rows). */
    int b = -1, p = !losses && g->n_outputs ? head_param(g, g->outputs[0], -1, m, &b) : -1;
    if (p >= 0) widen(g, p, m), padded = 1;
    if (b >= 0) widen(g, b, m);
    for (int n = 0; padded && n < g->n_nodes; n++) {
        char err[256];
        if (ir_node_retype(g, n, err, sizeof err)) {
            diag_error(d, g->nodes[n].loc, "internal error: pad_vocab: %s", err);
            return -1;
        }
    }
    return 0;
}
