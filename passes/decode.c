/* passes/decode.c: the decode program of a language model: the sampling program's forward
 * of one token at a position, with a KV cache per attention, for fsexec --sample.
 *
 * Needs: the lowered forward graph of the sampling program (one sequence: tokens [1, T],
 *        dropout already the identity), and its logits [1, T, V].
 * Gives: a new graph of the same params and blocks whose inputs are the token [1, 1] and
 *        its position (i32 [1], step role SR_POS), whose one output is that token's
 *        logits [1, 1, V]; the caller runs the forward passes on it. Every node is the
 *        original's on the one position, its shapes re-inferred by ir_node_add, but:
 *          arange(T)          the position (the positions the model embeds);
 *          rope(x)            rope_at(x, pos): x's row turned as at the position;
 *          attention(q, k, v, causal)
 *                             attention_decode(q, k, v, kcache, vcache, pos): k and v
 *                             written into the caches [.., NKV, T, hd] (role ROLE_KV_CACHE:
 *                             they persist between runs, like params) at row pos, then q
 *                             attends over rows 0..pos;
 *          the loss           dropped (it reads the targets, which decoding has not).
 *
 * What makes a model undecodable is found, not assumed: each value of the original graph
 * that depends on the tokens keeps its sequence axis (the one of length T that becomes 1);
 * a node whose result depends on the tokens but has no such axis, or whose reduction runs
 * along it, mixes positions (a reshape that hard-codes T fails in its shape rule), and so
 * does a non-causal attention. Then there is no decode program, and the reason says which
 * node of the source; the sampler uses the window program.
 */
#include <string.h>

#include "passes.h"

typedef struct {
    const Graph *g;   // the sampling program's lowered forward
    Graph *d;         // the decode graph being built
    int *map;         // [g->n_values] the value's copy in d, or -1 (none yet, or never)
    int *seq;         // [g->n_values] the axis of sequence positions, -1 for none
    int T, pos;       // the sequence length; d's position input
    char *why;
    size_t whylen;
} Dec;

/* why = "REASON (WHAT, line L:C)" for node n; -1. */
static int fail(Dec *c, const Node *n, const char *reason, const char *what)
{
    if (n->loc.line)
        snprintf(c->why, c->whylen, "%s (%s, line %d:%d)", reason, what, n->loc.line, n->loc.col);
    else
        snprintf(c->why, c->whylen, "%s (%s)", reason, what);
    return -1;
}

/* The copy of a value no node makes (a param, a constant input): made on first use. */
static int copy_leaf(Dec *c, int v)
{
    if (c->map[v] >= 0) return c->map[v];
    Value x = c->g->values[v];
    x.producer = -1;
    x.tied_to = x.tied_to >= 0 ? copy_leaf(c, x.tied_to) : -1;
    int id = ir_value_add(c->d, &x);
    c->d->values[id].step_role = c->g->values[v].step_role;
    return c->map[v] = id;
}

/* The sequence axis of old value v (new copy w) when it depends on the tokens: the one
 * axis whose length went from T to 1, every other the same; -1 when v's shape is not
 * its old one but for that axis (so the node mixed positions). */
static int seq_axis(const Dec *c, int v, int w)
{
    const Value *a = &c->g->values[v], *b = &c->d->values[w];
    int at = -1;
    if (a->rank != b->rank) return -1;
    for (int i = 0; i < a->rank; i++) {
        if (a->shape[i] == b->shape[i]) continue;
        if (at >= 0 || a->shape[i] != c->T || b->shape[i] != 1) return -1;
        at = i;
    }
    return at;
}

/* kcache or vcache of an attention: x's old shape (its T positions), x's new dtype. */
static int cache_of(Dec *c, const Node *n, int x, const char *what)
{
    const Block *b = n->block >= 0 ? &c->g->blocks[n->block] : NULL;
    Value v = c->g->values[x];
    v.dtype = c->d->values[c->map[x]].dtype;
    v.role = ROLE_KV_CACHE, v.producer = -1, v.tied_to = -1, v.init = INIT_NONE, v.block = n->block;
    v.name = arena_printf(c->d->arena, "%s%s%s", b ? b->name : "", b ? "." : "", what);
    return ir_value_add(c->d, &v);
}

/* The reduction axis of a reducing op on a tensor of rank r, or -1 for none. */
static int reduce_axis(const Dec *c, const Node *n, int r)
{
    if (!(op_info(n->op)->flags & OPF_REDUCE)) return -1;
    if (op_param_index(op_info(n->op), "axis") < 0) return r - 1;  // layernorm, rmsnorm: the last
    int64_t a = ir_attr_int(c->g, n, "axis", -1);
    return (int)(a < 0 ? a + r : a);
}

/* Node n on the one position; 0, or -1 with why (the node mixes positions). */
static int decode_node(Dec *c, const Node *n)
{
    const Graph *g = c->g;
    int in[IR_MAX_IN], n_in = n->n_in, dep = 0;
    for (int i = 0; i < n->n_in; i++) {
        int v = ir_in(g, n, i);
        if (g->values[v].producer < 0 && g->values[v].role != ROLE_INPUT) copy_leaf(c, v);
        if (c->map[v] < 0) return 0;  // reads the targets (the loss), or what did
        in[i] = c->map[v];
        if (c->seq[v] >= 0) {
            dep = 1;
            if (reduce_axis(c, n, g->values[v].rank) == c->seq[v])
                return fail(c, n, "it reduces along the sequence", op_name(n->op));
        }
    }
    Attr at[IR_MAX_PARAMS];
    int n_at = ir_node_attrs(g, n, at);
    OpKind op = n->op;
    if (op == OP_arange && ir_attr_int(g, n, "n", 0) == c->T) {
        c->map[ir_out(g, n, 0)] = c->pos, c->seq[ir_out(g, n, 0)] = 0;
        return 0;
    }
    if (op == OP_attention_masked)
        return fail(c, n, "its key padding mask has no KV-cache form (masked attention is for encoders)",
                    "attention_masked");
    if (op == OP_rope || op == OP_attention) {
        int r = g->values[ir_in(g, n, 0)].rank;
        for (int i = 0; i < (op == OP_rope ? 1 : 3); i++)
            if (c->seq[ir_in(g, n, i)] != r - 2)
                return fail(c, n, "its rows are not the token positions", op_name(op));
        if (op == OP_attention && !ir_attr_int(g, n, "causal", 0))
            return fail(c, n, "it is not causal: every position sees the later ones", "attention");
    }
    if (op == OP_rope) {
        op = OP_rope_at, in[n_in++] = c->pos;
    } else if (op == OP_attention) {
        op = OP_attention_decode, n_at = 0;
        in[3] = cache_of(c, n, ir_in(g, n, 1), "k_cache");
        in[4] = cache_of(c, n, ir_in(g, n, 2), "v_cache");
        in[5] = c->pos, n_in = 6;
    }
    char err[400];
    int id = ir_node_add(c->d, op, in, n_in, at, n_at, n->block, n->phase, n->loc, err, sizeof err);
    if (id < 0) return fail(c, n, "its shape rule fails on one position", err);
    const Node *m = ir_node(c->d, id);
    for (int o = 0; o < m->n_out && o < n->n_out; o++) {
        int v = ir_out(g, n, o), w = ir_out(c->d, m, o);
        c->map[v] = w;
        c->seq[v] = dep ? seq_axis(c, v, w) : -1;
        if (dep && c->seq[v] < 0)
            return fail(c, n, "its result mixes the sequence's positions", op_name(n->op));
    }
    return 0;
}

int passes_decode(const Graph *g, int logits, Graph **out, char *why, size_t whylen)
{
    *out = NULL;
    int tokens = -1, targets = -1;
    for (int n = 0; n < g->n_nodes; n++)
        if (g->nodes[n].op == OP_cross_entropy && ir_in(g, &g->nodes[n], 0) == logits) targets = ir_in(g, &g->nodes[n], 1);
    for (int v = 0; v < g->n_values; v++) {
        const Value *x = &g->values[v];
        if (x->role == ROLE_INPUT && x->step_role == SR_NONE && v != targets && tokens < 0) tokens = v;
    }
    const Value *tk = tokens >= 0 ? &g->values[tokens] : NULL;
    if (!tk || tk->dtype != DT_I32 || tk->rank != 2 || tk->shape[0] != 1) {
        snprintf(why, whylen, "the sampling program has no tokens input [1, T]");
        return -1;
    }
    Dec c = {g, ir_graph_new(g->model), NULL, NULL, (int)tk->shape[1], -1, why, whylen};
    c.map = arena_alloc(c.d->arena, sizeof *c.map * (size_t)g->n_values);
    c.seq = arena_alloc(c.d->arena, sizeof *c.seq * (size_t)g->n_values);
    for (int v = 0; v < g->n_values; v++) c.map[v] = c.seq[v] = -1;
    for (int b = 0; b < g->n_blocks; b++) ir_block_add(c.d, g->blocks[b].name, g->blocks[b].layer, g->blocks[b].index);
    Value tv = *tk;
    tv.shape[1] = 1;
    c.map[tokens] = ir_value_add(c.d, &tv), c.seq[tokens] = 1;
    Value pv = {.dtype = DT_I32, .rank = 1, .shape = {1}, .role = ROLE_INPUT, .block = -1, .name = "pos", .loc = tk->loc,
                .producer = -1, .tied_to = -1};
    c.pos = ir_value_add(c.d, &pv);
    c.d->values[c.pos].step_role = SR_POS;
    int rc = 0;
    for (int n = 0; n < g->n_nodes && !rc; n++) rc = decode_node(&c, &g->nodes[n]);
    if (!rc && (c.map[logits] < 0 || c.seq[logits] != 1)) {
        snprintf(why, whylen, "the logits do not follow from the tokens position by position");
        rc = -1;
    }
    if (rc) {
        ir_graph_free(c.d);
        return -1;
    }
    ir_output_add(c.d, c.map[logits]);
    *out = c.d;
    return 0;
}
