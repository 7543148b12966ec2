/* passes/recompute.c: activation checkpointing (FairScale's checkpoint_wrapper) planned
 * ahead of time.
 *
 * Needs: autodiff's backward nodes; `recompute` names blocks (ir/config.c: recompute_mode:
 *        layers, instances, ranges, all), each full or `attention:` only.
 * Gives: for each block recomputed in full, a copy of its forward (phase recompute) placed just
 *        before its backward, which then reads the copies instead of the activations the
 *        forward made. The forward's activations die as soon as the forward is done with
 *        them; only what other blocks read stays (a block's input is the previous one's
 *        output). The copies compute exactly what the forward did, so gradients are
 *        bit-identical; the memory plan shows the saving, the FLOP count the extra work.
 *        For a block recomputed `attention:` only (Megatron's selective recompute), a
 *        copy of its attention core alone (recompute_attention), before the first
 *        backward node that reads it. A block applied more than once (a shared
 *        instance: Node.use) is recomputed as one unit, one application at a time: each
 *        reruns just before the first backward node of the block that reads what it
 *        made, so no more than one application's activations are made again at once.
 *        And, whatever the setting: a layout copy (merge_heads, transpose: OPF_LAYOUT, no
 *        arithmetic) whose output the backward reads, of inputs the backward keeps anyway
 *        (read by it, or persistent), is made again just before its first backward
 *        reader (a node of the backward) instead of being kept: the attention output is kept once (attention's
 *        backward reads it), not twice (merge_heads' copy for the projection's weight
 *        gradient), and transpose(wte) is not kept through the forward.
 */
#include <string.h>

#include "passes.h"

typedef struct {
    Graph *g;
    int *clone_of;   // per value: its recomputed copy, or -1
    int *placed_at;  // per new node: the original node it goes before, or -1
    int n_orig;
} Recompute;

/* Copies forward node n, as a node of `phase`, with inputs mapped to earlier copies;
 * returns the copy's id. */
static int clone_node(Recompute *r, int n, Phase phase)
{
    Graph *g = r->g;
    Node node = g->nodes[n];
    int in[IR_MAX_IN];
    for (int i = 0; i < node.n_in; i++) {
        int v = ir_in(g, &node, i);
        in[i] = r->clone_of[v] >= 0 ? r->clone_of[v] : v;
    }
    Attr attrs[IR_MAX_PARAMS];
    ir_node_attrs(g, &node, attrs);
    char err[256];
    int c = ir_node_add(g, node.op, in, node.n_in, attrs, node.n_attr, node.block, phase, node.loc, err, sizeof err);
    FS_ASSERT(c >= 0);
    g->nodes[c].chunk = node.chunk;
    g->nodes[c].use = node.use;
    for (int i = 0; i < node.n_out; i++) {
        int v = ir_out(g, &node, i), w = ir_out(g, ir_node(g, c), i);
        r->clone_of[v] = w;
        /* A checkpoint's rerun, which a micro-batch that does not recompute reads through
         * (passes/pipeline.c); a layout copy for the backward is every micro-batch's own. */
        if (phase == PHASE_RECOMPUTE) g->values[w].recompute_of = v;
    }
    return c;
}

/* Whether node n is in the region recomputed: block b's, or (b < 0) model chunk -b - 1
 * of a pipeline stage: its whole forward but its receives (the chunk's inputs, kept) and
 * sends (made once). */
static int in_region(const Graph *g, int n, int b)
{
    const Node *node = ir_node(g, n);
    return b >= 0 ? node->block == b : node->chunk == -b - 1 && !(op_info(node->op)->flags & OPF_P2P);
}

static int backward_phase(Phase p) { return p == PHASE_BACKWARD || p == PHASE_WGRAD; }

/* Whether the backward keeps value v anyway: it reads it, or it lives across the step. */
static int kept_anyway(const Graph *g, const uint8_t *read_back, int v)
{
    Role r = ir_value(g, v)->role;
    return read_back[v] || r == ROLE_PARAM || r == ROLE_INPUT || r == ROLE_OPT_STATE || r == ROLE_MASTER ||
           r == ROLE_PARAM16;
}

/* Per value: whether a backward node reads it (now). */
static uint8_t *read_back_of(const Recompute *r)
{
    Graph *g = r->g;
    uint8_t *read_back = arena_alloc(g->arena, (size_t)g->n_values + 1);
    memset(read_back, 0, (size_t)g->n_values + 1);
    for (int n = 0; n < r->n_orig; n++)
        if (backward_phase(g->nodes[n].phase))
            for (int i = 0; i < g->nodes[n].n_in; i++) read_back[ir_in(g, &g->nodes[n], i)] = 1;
    return read_back;
}

/* Reruns the forward nodes marked in `set` (phase recompute) just before node `at`; the
 * backward nodes of region b (in_region) read the copies from there on. */
static void rerun(Recompute *r, const uint8_t *set, int b, int at)
{
    Graph *g = r->g;
    for (int n = 0; n < r->n_orig; n++)
        if (set[n]) r->placed_at[clone_node(r, n, PHASE_RECOMPUTE)] = at;
    for (int n = at; n < r->n_orig; n++) {
        Node *node = &g->nodes[n];
        if (!in_region(g, n, b) || !backward_phase(node->phase)) continue;
        for (int i = 0; i < node->n_in; i++) {
            int v = g->ids[node->in + i];
            if (r->clone_of[v] >= 0) g->ids[node->in + i] = r->clone_of[v];
        }
    }
    /* The next region's copies must read what its own forward read, not these. */
    for (int n = 0; n < r->n_orig; n++)
        if (set[n])
            for (int i = 0; i < g->nodes[n].n_out; i++) r->clone_of[ir_out(g, &g->nodes[n], i)] = -1;
}

/* Reruns the nodes in `set` (whose outputs `made` marks) just before the first backward
 * node of block b that reads one of them; nothing when none does. */
static void rerun_before_readers(Recompute *r, const uint8_t *set, const uint8_t *made, int b)
{
    Graph *g = r->g;
    int at = -1;
    for (int n = 0; n < r->n_orig && at < 0; n++)
        if (g->nodes[n].block == b && backward_phase(g->nodes[n].phase))
            for (int i = 0; i < g->nodes[n].n_in && at < 0; i++)
                if (made[ir_in(g, &g->nodes[n], i)]) at = n;
    if (at >= 0) rerun(r, set, b, at);
}

/* Whether node n is a forward node of block b's application u (u < 0: any). */
static int in_use(const Graph *g, int n, int b, int u)
{
    const Node *node = ir_node(g, n);
    return node->block == b && node->phase == PHASE_FORWARD && (u < 0 || node->use == u);
}

/* How many times block b is applied (a shared instance: Node.use); 1 for a chunk (b < 0). */
static int uses_of(const Recompute *r, int b)
{
    int uses = 1;
    for (int n = 0; n < r->n_orig && b >= 0; n++)
        if (in_use(r->g, n, b, -1) && r->g->nodes[n].use >= uses) uses = r->g->nodes[n].use + 1;
    return uses;
}

/* Application u of a block applied more than once, just before the first backward node
 * of the block that reads what it made: the applications rerun one at a time (the last
 * first), each from its input, the previous one's output, which the forward keeps. */
static void recompute_use(Recompute *r, int b, int u)
{
    Graph *g = r->g;
    uint8_t *set = arena_alloc(g->arena, (size_t)r->n_orig + 1), *made = arena_alloc(g->arena, (size_t)g->n_values + 1);
    memset(made, 0, (size_t)g->n_values + 1);
    for (int n = 0; n < r->n_orig; n++)
        if ((set[n] = (uint8_t)in_use(g, n, b, u)))
            for (int i = 0; i < g->nodes[n].n_out; i++) made[ir_out(g, &g->nodes[n], i)] = 1;
    rerun_before_readers(r, set, made, b);
}

/* The whole forward of block b (or a pipeline chunk, b < 0), before its first backward
 * node; a block applied several times, one application at a time (recompute_use). */
static void recompute_block(Recompute *r, int b)
{
    Graph *g = r->g;
    int first_bwd = -1, uses = uses_of(r, b);
    if (uses > 1) {
        for (int u = uses - 1; u >= 0; u--) recompute_use(r, b, u);
        return;
    }
    for (int n = 0; n < r->n_orig && first_bwd < 0; n++)
        if (in_region(g, n, b) && backward_phase(g->nodes[n].phase)) first_bwd = n;
    if (first_bwd < 0) return;  // nothing differentiates through this block
    uint8_t *set = arena_alloc(g->arena, (size_t)r->n_orig + 1);
    for (int n = 0; n < r->n_orig; n++) set[n] = in_region(g, n, b) && g->nodes[n].phase == PHASE_FORWARD;
    rerun(r, set, b, first_bwd);
}

/* Selective recompute of block b: its attention ops, with what they read back to the
 * nearest GEMMs (GPT-2: from ln1's output, so the QKV projection, its bias, split and
 * heads rerun, or under pack_attention the projection, its bias and attention_qkv; Llama's
 * packed: rope_rows and attention_rows; a GEMM's inputs are kept, as its weight gradient reads them), and the
 * layout copies of their outputs that the backward reads (merge_heads for the
 * projection's weight gradient). The attention's saved q, k, v, its output and
 * log-sum-exp are then not kept from the forward to the backward; the block's other
 * activations are. With flash-style attention (no T x T probabilities saved), this is
 * what selective recompute can save: 4sbh of a GPT-2 block's 16sbh, and the row
 * log-sum-exp. */
static void recompute_attention(Recompute *r, int b, int u)
{
    Graph *g = r->g;
    uint8_t *read_back = read_back_of(r), *set = arena_alloc(g->arena, (size_t)r->n_orig + 1), *made = NULL;
    uint8_t *outside = arena_alloc(g->arena, (size_t)g->n_values + 1);
    memset(set, 0, (size_t)r->n_orig + 1);
    memset(outside, 0, (size_t)g->n_values + 1);
    for (int n = 0; n < r->n_orig; n++)
        if (backward_phase(g->nodes[n].phase) && g->nodes[n].block != b)
            for (int i = 0; i < g->nodes[n].n_in; i++) outside[ir_in(g, &g->nodes[n], i)] = 1;
    for (int n = r->n_orig - 1; n >= 0; n--) {
        const Node *node = &g->nodes[n];
        if (!in_use(g, n, b, u)) continue;
        if (node->op == OP_attention || node->op == OP_attention_qkv || node->op == OP_attention_masked ||
            node->op == OP_attention_qkv_masked || node->op == OP_attention_rows)
            set[n] = 1;
        if (!set[n] || node->op == OP_matmul) continue;
        for (int i = 0; i < node->n_in; i++) {
            int v = ir_in(g, node, i), p = g->values[v].producer;
            if (p >= 0 && p < r->n_orig && in_use(g, p, b, u) && !outside[v] && !kept_anyway(g, outside, v))
                set[p] = 1;
        }
    }
    made = arena_alloc(g->arena, (size_t)g->n_values + 1);
    memset(made, 0, (size_t)g->n_values + 1);
    for (int n = 0; n < r->n_orig; n++) {
        const Node *node = &g->nodes[n];
        int flags = op_info(node->op)->flags, from_set = 0, ok = in_use(g, n, b, u) &&
            (flags & OPF_LAYOUT) && !(flags & OPF_VIEW) && node->n_out == 1 && read_back[ir_out(g, node, 0)];
        for (int i = 0; i < node->n_in && ok; i++) {
            int v = ir_in(g, node, i);
            from_set |= made[v];
            ok = made[v] || kept_anyway(g, read_back, v);
        }
        if (ok && from_set) set[n] = 1;
        if (set[n])
            for (int i = 0; i < node->n_out; i++) made[ir_out(g, node, i)] = 1;
    }
    rerun_before_readers(r, set, made, b);
}

/* The layout copies the backward would keep (see the top), made again before their first
 * backward reader, which (with every later one) reads the new copy. */
static void recompute_layout_copies(Recompute *r)
{
    Graph *g = r->g;
    uint8_t *read_back = read_back_of(r);
    for (int n = 0; n < r->n_orig; n++) {
        const Node *node = &g->nodes[n];
        int flags = op_info(node->op)->flags;
        if (node->phase != PHASE_FORWARD || !(flags & OPF_LAYOUT) || (flags & OPF_VIEW) || node->n_out != 1) continue;
        int out = ir_out(g, node, 0), ok = read_back[out] && r->clone_of[out] < 0;
        for (int i = 0; i < node->n_in && ok; i++) ok = kept_anyway(g, read_back, ir_in(g, node, i));
        if (!ok) continue;
        int first = -1;
        for (int k = n + 1; k < r->n_orig && first < 0; k++)
            if (backward_phase(g->nodes[k].phase))
                for (int i = 0; i < g->nodes[k].n_in && first < 0; i++)
                    if (ir_in(g, &g->nodes[k], i) == out) first = k;
        int c = clone_node(r, n, PHASE_BACKWARD);  // a copy for the backward, not a checkpoint's rerun
        r->placed_at[c] = first;
        for (int k = first; k < r->n_orig; k++) {
            Node *reader = &g->nodes[k];
            if (!backward_phase(reader->phase)) continue;
            for (int i = 0; i < reader->n_in; i++)
                if (g->ids[reader->in + i] == out) g->ids[reader->in + i] = r->clone_of[out];
        }
        r->clone_of[out] = -1;
    }
}

int pass_recompute(Graph *g, const Options *o, Diag *d)
{
    (void)d;
    const TrainConfig *t = &o->train;
    /* A pipeline stage whose micro-batches checkpoint (passes/pipeline.c decides which:
     * FairScale Pipe's always or except_last) recomputes its whole forward (each model
     * chunk's, just before that chunk's backward), once, here, for micro-batch 0; the
     * pipeline pass copies it into those that do. */
    int stage = g->n_stages > 1 && checkpoint_recomputes(t, 0);
    int n_values = g->n_values;
    Recompute r = {g, arena_alloc(g->arena, sizeof(int) * (size_t)n_values * 4 + 1),
                   arena_alloc(g->arena, sizeof(int) * (size_t)g->n_nodes * 3 + 1), g->n_nodes};
    memset(r.clone_of, -1, sizeof(int) * (size_t)n_values * 4);
    memset(r.placed_at, -1, sizeof(int) * (size_t)g->n_nodes * 3);
    if (stage)
        for (int c = 0; c < g->n_stages * g->n_chunks; c++) {
            if (c % g->n_stages == g->stage) recompute_block(&r, -c - 1);
        }
    else
        for (int b = 0; b < g->n_blocks; b++) {
            RecomputeMode m = recompute_mode(t->recompute, &g->blocks[b]);
            int uses = m == RC_ATTENTION ? uses_of(&r, b) : 0;
            if (m == RC_FULL) recompute_block(&r, b);
            for (int u = uses - 1; u >= 0; u--) recompute_attention(&r, b, uses > 1 ? u : -1);
        }
    recompute_layout_copies(&r);
    if (g->n_nodes == r.n_orig) return 0;

    /* The copies go, in the order they were made, just before their block's backward. */
    int *order = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_nodes);
    int k = 0;
    for (int n = 0; n < r.n_orig; n++) {
        for (int c = r.n_orig; c < g->n_nodes; c++)
            if (r.placed_at[c] == n) order[k++] = c;
        order[k++] = n;
    }
    FS_ASSERT(k == g->n_nodes);
    ir_nodes_reorder(g, order);
    return 0;
}
