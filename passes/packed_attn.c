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
 *        readers), the log-sum-exp takes over attention's. Chains that do not match (Llama:
 *        rope on q and k after heads) keep their ops. An attention_masked chain (x [B, T, W]) becomes
 *        attention_qkv_masked(x, mask) alike, the mask read where it lies.
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

/* attention_qkv (_masked) where c's merge_heads was, making its value; c's six nodes dropped. */
static void rewrite(Graph *g, const Chain *c)
{
    const Node *an = ir_node(g, c->att), *mn = ir_node(g, c->merge);
    int masked = an->op == OP_attention_masked;
    int x[2] = {ir_in(g, ir_node(g, c->split), 0), masked ? ir_in(g, an, 3) : -1};  // qkv (and the mask)
    Attr at[3] = {{.key = "nh", .kind = ATTR_INT, .i = ir_attr_int(g, ir_node(g, c->head[0]), "n", 1)},
                  {.key = "nkv", .kind = ATTR_INT, .i = ir_attr_int(g, ir_node(g, c->head[1]), "n", 1)},
                  {.key = "causal", .kind = ATTR_INT, .i = ir_attr_int(g, an, "causal", 0)}};
    char err[256];
    int f = ir_node_add(g, masked ? OP_attention_qkv_masked : OP_attention_qkv, x, 1 + masked, at, 3, mn->block,
                        mn->phase, mn->loc, err, sizeof err);
    FS_ASSERT(f >= 0);
    g->nodes[f].mb = g->nodes[c->merge].mb, g->nodes[f].chunk = g->nodes[c->merge].chunk;
    g->nodes[f].use = g->nodes[c->merge].use;  // the application of a shared block it belongs to
    const Node *fn = ir_node(g, f);
    an = ir_node(g, c->att), mn = ir_node(g, c->merge);
    ir_value_take_over(g, ir_out(g, mn, 0), ir_out(g, fn, 0));
    ir_value_take_over(g, ir_out(g, an, 1), ir_out(g, fn, 1));

    int gone[6] = {c->split, c->head[0], c->head[1], c->head[2], c->att, c->merge};
    char *drop = arena_alloc(g->arena, (size_t)g->n_nodes);
    memset(drop, 0, (size_t)g->n_nodes);
    for (int i = 0; i < 6; i++) drop[gone[i]] = 1;
    int *order = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_nodes), k = 0;
    for (int i = 0; i < f; i++) {
        if (i == c->merge) order[k++] = f;
        if (!drop[i]) order[k++] = i;
    }
    for (int i = 0; i < 6; i++) order[k++] = gone[i];
    FS_ASSERT(k == g->n_nodes);
    ir_nodes_reorder(g, order);
    ir_graph_drop_last(g, 6);
}

int pass_packed_attn(Graph *g, const Options *o, Diag *d)
{
    (void)d;
    if (!o->train.pack_attention) return 0;
    Chain c;
    for (int a = 0; a < g->n_nodes; a++)
        if (match(g, a, &c)) rewrite(g, &c), a = -1;
    return 0;
}
