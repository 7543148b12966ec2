/* passes/packed_attn.c: attention without layout copies. GPT-2 writes
 *
 *     q, k, v = split(x, 3);  y = merge_heads(attention(heads(q, NH), heads(k, NH), heads(v, NH), causal))
 *
 * where x [B, T, 3C] is the QKV projection's output. Each of split, heads and merge_heads
 * is a copy, and autodiff adds their adjoints (concat, merge_heads, heads); the forward
 * saves the three [B, NH, T, hd] heads and both the attention's output and merge_heads'
 * copy of it. Here the chain becomes one attention_qkv(x, nh, nkv, causal), whose kernels
 * read each head as a column range of x's rows and write y [B, T, NH hd] directly; its
 * backward writes dx in x's layout. What is saved is x and y (and the row log-sum-exp, as
 * before): at GPT-2 that is 4 BTC per block instead of 5 BTC, and the copies' time goes.
 *
 * Needs: the forward graph (before stages and autodiff: the gradient rule makes the packed
 *        backward; recompute, selective or full, reruns the packed op like any other);
 *        the `pack_attention` setting (on by default).
 * Gives: each chain split(x, n = 3, last axis) -> heads(q), heads(k), heads(v) -> attention
 *        -> merge_heads, where every value between x and y is read only by the next op of
 *        the chain and is no output of the step, and the three heads have one width,
 *        replaced by attention_qkv(x) where the merge_heads was; y keeps its value (name,
 *        readers), the log-sum-exp takes over attention's. An attention_masked chain (x [B, T, W])
 *        becomes attention_qkv_masked(x, mask) alike, the mask read where it lies.
 *        Llama's chain, q, k and v from projections of their own and rope on q and k:
 *            merge_heads(attention(rope(heads(xq, NH)), rope(heads(xk, NKV)), heads(xv, NKV), causal))
 *        (each input heads(x_i) or rope(heads(x_i)), every value between the x_i and y read
 *        only by the next op, the x_i over the same rows with one head width, NH a multiple
 *        of NKV) becomes rope_rows(xq, NH), rope_rows(xk, NKV) and attention_rows(q, k, xv,
 *        NH, NKV), reading each head as a column range of the x_i's rows: no heads or
 *        merge_heads copies forward or backward, rope's backward on the same layout.
 *        Other chains keep their ops.
 *
 * Forward-only programs (evaluation, sampling, decode) never run it. Every backend
 * computes the same numbers either way (the CPU's to fp32 rounding; tests/unit/test_packed_attn.c).
 */
#include <string.h>

#include "passes.h"

/* How many inputs of nodes read v (an output of the step counts as two); *who the last node. */
static int readers(const Graph *g, int v, int *who)
{
    int n = 0;
    for (int i = 0; i < g->n_outputs; i++) n += 2 * (g->outputs[i] == v);
    for (int k = 0; k < g->n_nodes; k++)
        for (int i = 0; i < g->nodes[k].n_in; i++)
            if (ir_in(g, ir_node(g, k), i) == v) n++, *who = k;
    return n;
}

/* The one node that reads v, through one input, or -1. */
static int sole_reader(const Graph *g, int v)
{
    int who = -1;
    return readers(g, v, &who) == 1 ? who : -1;
}

/* A chain: the split, the three heads, the attention and the merge_heads (ids in order). */
typedef struct {
    int split, head[3], att, merge;
} Chain;

/* Whether attention node a heads a chain that matches (see the top); *c filled. */
static int match(const Graph *g, int a, Chain *c)
{
    const Node *an = ir_node(g, a);
    if (an->op != OP_attention && an->op != OP_attention_masked) return 0;
    c->att = a, c->split = -1;
    for (int i = 0; i < 3; i++) {
        int h = ir_value(g, ir_in(g, an, i))->producer;
        if (h < 0 || g->nodes[h].op != OP_heads || sole_reader(g, ir_in(g, an, i)) != a) return 0;
        int s = ir_value(g, ir_in(g, ir_node(g, h), 0))->producer;
        if (s < 0 || g->nodes[s].op != OP_split || (c->split >= 0 && s != c->split)) return 0;
        const Node *sn = ir_node(g, s);
        int rank = ir_value(g, ir_in(g, sn, 0))->rank, axis = (int)ir_attr_int(g, sn, "axis", -1);
        if (sn->n_out != 3 || (axis != -1 && axis != rank - 1) || ir_out(g, sn, i) != ir_in(g, ir_node(g, h), 0) ||
            sole_reader(g, ir_out(g, sn, i)) != h)
            return 0;
        c->split = s, c->head[i] = h;
    }
    int64_t D = ir_value(g, ir_in(g, an, 0))->shape[ir_value(g, ir_in(g, an, 0))->rank - 1];
    for (int i = 1; i < 3; i++) {
        const Value *x = ir_value(g, ir_in(g, an, i));
        if (x->shape[x->rank - 1] != D) return 0;
    }
    if (an->op == OP_attention_masked && ir_value(g, ir_in(g, ir_node(g, c->split), 0))->rank != 3) return 0;
    c->merge = sole_reader(g, ir_out(g, an, 0));
    return c->merge >= 0 && g->nodes[c->merge].op == OP_merge_heads && readers(g, ir_out(g, an, 1), &(int){0}) == 0;
}

/* Nodes made[0..n_made) (the last of the graph, in that order) moved to where `at` was, and gone[0..n_gone) dropped
 * (at among them). */
static void replace_at(Graph *g, int at, int n_made, const int *gone, int n_gone)
{
    int first = g->n_nodes - n_made;
    char *drop = arena_alloc(g->arena, (size_t)g->n_nodes);
    memset(drop, 0, (size_t)g->n_nodes);
    for (int i = 0; i < n_gone; i++) drop[gone[i]] = 1;
    int *order = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_nodes), k = 0;
    for (int i = 0; i < first; i++) {
        if (i == at)
            for (int m = first; m < g->n_nodes; m++) order[k++] = m;
        if (!drop[i]) order[k++] = i;
    }
    for (int i = 0; i < n_gone; i++) order[k++] = gone[i];
    FS_ASSERT(k == g->n_nodes);
    ir_nodes_reorder(g, order);
    ir_graph_drop_last(g, n_gone);
}

/* A node op(in, at) where `like` is (its block, phase, micro-batch, chunk and use), from `loc`'s source line. */
static int add_like(Graph *g, OpKind op, const int *in, int n_in, const Attr *at, int n_at, int like, int loc)
{
    char err[256];
    const Node *ln = ir_node(g, like);
    int f = ir_node_add(g, op, in, n_in, at, n_at, ln->block, ln->phase, ir_node(g, loc)->loc, err, sizeof err);
    FS_ASSERT(f >= 0);
    g->nodes[f].mb = g->nodes[like].mb, g->nodes[f].chunk = g->nodes[like].chunk;
    g->nodes[f].use = g->nodes[like].use;  // the application of a shared block it belongs to
    return f;
}

/* The attention node a's output y and lse handed to f's outputs 0 and 1 (merge: the merge_heads that made y). */
static void take_over(Graph *g, int a, int merge, int f)
{
    ir_value_take_over(g, ir_out(g, ir_node(g, merge), 0), ir_out(g, ir_node(g, f), 0));
    ir_value_take_over(g, ir_out(g, ir_node(g, a), 1), ir_out(g, ir_node(g, f), 1));
}

/* attention_qkv (_masked) where c's merge_heads was, making its value; c's six nodes dropped. */
static void rewrite(Graph *g, const Chain *c)
{
    const Node *an = ir_node(g, c->att);
    int masked = an->op == OP_attention_masked;
    int x[2] = {ir_in(g, ir_node(g, c->split), 0), masked ? ir_in(g, an, 3) : -1};  // qkv (and the mask)
    Attr at[3] = {{.key = "nh", .kind = ATTR_INT, .i = ir_attr_int(g, ir_node(g, c->head[0]), "n", 1)},
                  {.key = "nkv", .kind = ATTR_INT, .i = ir_attr_int(g, ir_node(g, c->head[1]), "n", 1)},
                  {.key = "causal", .kind = ATTR_INT, .i = ir_attr_int(g, ir_node(g, c->att), "causal", 0)}};
    int f = add_like(g, masked ? OP_attention_qkv_masked : OP_attention_qkv, x, 1 + masked, at, 3, c->merge,
                     c->merge);
    take_over(g, c->att, c->merge, f);
    replace_at(g, c->merge, 1, (int[]){c->split, c->head[0], c->head[1], c->head[2], c->att, c->merge}, 6);
}

/* Llama's chain: attention(q, k, v) -> merge_heads, each input heads(x_i, n_i) or rope(heads(x_i, n_i)) (ids in
 * order; rope[i] -1 where input i has none). */
typedef struct {
    int head[3], rope[3], att, merge;
} RowChain;

/* Whether attention node a heads a Llama chain (see the top): every value between the x_i and y read only by the
 * next op, q's heads nh, k's and v's nkv with nh a multiple of nkv, the x_i of one width per head over the same
 * rows; *c filled. */
static int match_rows(const Graph *g, int a, RowChain *c)
{
    const Node *an = ir_node(g, a);
    if (an->op != OP_attention) return 0;
    c->att = a;
    const Value *x[3];
    for (int i = 0; i < 3; i++) {
        int v = ir_in(g, an, i), p = ir_value(g, v)->producer;
        if (p < 0 || sole_reader(g, v) != a) return 0;
        c->rope[i] = -1;
        if (g->nodes[p].op == OP_rope) {
            c->rope[i] = p, v = ir_in(g, ir_node(g, p), 0), p = ir_value(g, v)->producer;
            if (p < 0 || sole_reader(g, v) != c->rope[i]) return 0;
        }
        if (g->nodes[p].op != OP_heads) return 0;
        c->head[i] = p, x[i] = ir_value(g, ir_in(g, ir_node(g, p), 0));
    }
    int64_t n[3], r = x[0]->rank;
    for (int i = 0; i < 3; i++) {
        n[i] = ir_attr_int(g, ir_node(g, c->head[i]), "n", 1);
        if (x[i]->rank != r || x[i]->shape[r - 1] / n[i] != x[0]->shape[r - 1] / n[0]) return 0;
        for (int d = 0; d < r - 1; d++)
            if (x[i]->shape[d] != x[0]->shape[d]) return 0;
    }
    if (n[1] != n[2] || n[0] % n[1]) return 0;
    c->merge = sole_reader(g, ir_out(g, an, 0));
    return c->merge >= 0 && g->nodes[c->merge].op == OP_merge_heads && readers(g, ir_out(g, an, 1), &(int){0}) == 0;
}

/* rope_rows for each rope of c, then attention_rows where c's merge_heads was; c's nodes dropped. */
static void rewrite_rows(Graph *g, const RowChain *c)
{
    int in[3], gone[9], n_gone = 0, made = 0;
    for (int i = 0; i < 3; i++) {
        const Node *h = ir_node(g, c->head[i]);
        in[i] = ir_in(g, h, 0), gone[n_gone++] = c->head[i];
        if (c->rope[i] < 0) continue;
        const Node *rn = ir_node(g, c->rope[i]);
        Attr at[4] = {{.key = "n", .kind = ATTR_INT, .i = ir_attr_int(g, h, "n", 1)},
                      {.key = "theta", .kind = ATTR_FLOAT, .f = ir_attr_float(g, rn, "theta", 10000)},
                      {.key = "inverse", .kind = ATTR_INT, .i = ir_attr_int(g, rn, "inverse", 0)},
                      {.key = "interleaved", .kind = ATTR_INT, .i = ir_attr_int(g, rn, "interleaved", 0)}};
        int f = add_like(g, OP_rope_rows, &in[i], 1, at, 4, c->merge, c->rope[i]);
        in[i] = ir_out(g, ir_node(g, f), 0), gone[n_gone++] = c->rope[i], made++;
    }
    Attr at[3] = {{.key = "nh", .kind = ATTR_INT, .i = ir_attr_int(g, ir_node(g, c->head[0]), "n", 1)},
                  {.key = "nkv", .kind = ATTR_INT, .i = ir_attr_int(g, ir_node(g, c->head[1]), "n", 1)},
                  {.key = "causal", .kind = ATTR_INT, .i = ir_attr_int(g, ir_node(g, c->att), "causal", 0)}};
    int f = add_like(g, OP_attention_rows, in, 3, at, 3, c->merge, c->merge);
    take_over(g, c->att, c->merge, f);
    gone[n_gone++] = c->att, gone[n_gone++] = c->merge;
    replace_at(g, c->merge, made + 1, gone, n_gone);
}

int pass_packed_attn(Graph *g, const Options *o, Diag *d)
{
    (void)d;
    if (!o->train.pack_attention) return 0;
    Chain c;
    RowChain rc;
    for (int a = 0; a < g->n_nodes; a++)
        if (match(g, a, &c)) rewrite(g, &c), a = -1;
        else if (match_rows(g, a, &rc)) rewrite_rows(g, &rc), a = -1;
    return 0;
}
