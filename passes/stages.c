/* passes/stages.c: pipeline stages (FairScale's Pipe, ahead of time).
 *
 * Needs: the forward graph of one micro-batch (precision ran: casts and fp16 state are
 *        there); `stages` P > 1, `balance` (auto, or blocks per stage).
 * Gives: the graph's stage_graphs, one per stage, each a forward graph of its own that
 *        the later passes (autodiff on) rewrite alone, as they rewrite a graph of one
 *        program:
 *  - Every block sits on exactly one stage: contiguous runs of blocks, stage s holding
 *    the s-th run (`balance 3,3,2`, or `auto`: the cost model below). A block applied
 *    more than once (a shared instance, frontend/instance.c) keeps every block that runs
 *    between its first and last application on its stage (no cut falls there: `auto`
 *    avoids those cuts, an explicit balance that makes one is an error), so its params
 *    are one stage's and activations only flow to later stages. With the
 *    interleaved schedule the runs are P x V model chunks (virtual stages), chunk c on
 *    stage c % P; Node.chunk says each node's (V = 1: the stage itself).
 *  - A node outside blocks whose inputs are all params, data inputs or such nodes (the
 *    embedding, a param's compute-dtype cast, arange) is free: it is copied into every
 *    stage that reads it, as are the params and inputs it reads. Any other node goes on
 *    the latest stage among its inputs' (the final norm, the head, the loss: the last).
 *  - A value one stage makes and another reads is sent right after the node that makes
 *    it (send, peer = the reader's stage, tag = the chunk that made it) and received on
 *    the reader's stage just before its first use (recv). Receives from one stage are
 *    taken in the order it sends, so the k-th send from a to b with a tag meets the k-th
 *    receive on b from a with that tag. Each stage graph lists
 *    these as its links (Graph.links), from which autodiff adds the backward's: the
 *    gradient of every received float value goes back (zeros when none flows), and each
 *    sent one's gradient comes back to seed the backward.
 *  - A param several stages read (a tied embedding: GPT-2's wte on the first stage and
 *    the head on the last) is a param of each of them, with one name: the same init
 *    (keyed by name), its gradients summed across them after the last micro-batch
 *    (passes/pipeline.c), so the copies stay equal. All but the first count it nowhere
 *    in the gradient norm (Value.pipe_copy).
 *  - The loss is the last stage's first output; the fp16 loss-scale state is every
 *    stage's (each unscales and updates it from the same global norm).
 *
 * The cost model of `balance auto`: a block's time is its forward FLOPs (the backward is
 * about twice that in every block alike, so it does not move the cut); the free nodes
 * (the embedding) count on the first stage and every other node outside blocks (the
 * head, the loss) on the last. A stage's memory is 16 bytes per param (fp32 param, grad
 * and AdamW's two moments) and its blocks' activations times the micro-batches it holds
 * at once: min(P - s, M) under 1F1B and zb1, M otherwise. The cut minimizes the slowest stage's
 * time, then, among cuts within 2% of it, the largest stage's memory.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct {
    int value, next;  // a value sent, and the next entry of its pair's queue (-1: none)
} Sent;

typedef struct {
    Graph *g;
    int P, V, PV;     // stages, model chunks per stage, chunks (virtual stages) in all
    char *cut_ok;     // [n_blocks + 1]: whether blocks j - 1 and j may sit on different chunks
    int *cut_by;      // [n_blocks + 1]: when not, a shared block that keeps them together
    int *stage_of_block;  // the chunk (virtual stage) of each block
    int *stage;       // per node: its chunk, or -1 when free
    int *needs;       // [P][n_nodes]: free node n is needed on stage s, by chunk needs - 1 first
    int *reads;       // [P][n_values]: stage s reads value v, by chunk reads - 1 first
    Graph **sg;       // the stage graphs
    int *vmap;        // [P][n_values]: v's value in stage s's graph, or -1
    Sent *sent;       // every send, each in its pair's queue of those not received yet
    int n_sent, cap_sent;
    int *q_head, *q_tail;  // [P][P]: pair (a, b)'s first and last entry in `sent`, or -1
} Split;

static int *vmap_of(Split *s, int st) { return &s->vmap[(size_t)st * (size_t)s->g->n_values]; }

/* Stage a sends v to stage b: the end of their queue. */
static void enqueue(Split *s, int a, int b, int v)
{
    s->sent = arena_grow(s->g->arena, s->sent, &s->cap_sent, s->n_sent + 1, sizeof *s->sent);
    int e = s->n_sent++, *tail = &s->q_tail[a * s->P + b];
    s->sent[e] = (Sent){v, -1};
    if (*tail >= 0)
        s->sent[*tail].next = e;
    else
        s->q_head[a * s->P + b] = e;
    *tail = e;
}

/* The oldest value a has sent b that b has not received. */
static int dequeue(Split *s, int a, int b)
{
    int *head = &s->q_head[a * s->P + b], e = *head;
    FS_ASSERT(e >= 0);
    *head = s->sent[e].next;
    if (*head < 0) s->q_tail[a * s->P + b] = -1;
    return s->sent[e].value;
}

/* ---- the cut ------------------------------------------------------------------------ */

/* Which cuts keep each shared block's applications, and every block between them, on
 * one chunk: no cut between the least and the greatest block running from a block's
 * first node to its last. */
static void find_cuts(Split *s)
{
    Graph *g = s->g;
    int nb = g->n_blocks, *first = arena_alloc(g->arena, sizeof(int) * (size_t)nb + 1);
    int *last = arena_alloc(g->arena, sizeof(int) * (size_t)nb + 1);
    s->cut_ok = arena_alloc(g->arena, (size_t)nb + 1);
    s->cut_by = arena_alloc(g->arena, sizeof(int) * (size_t)nb + 1);
    memset(s->cut_ok, 1, (size_t)nb + 1);
    for (int b = 0; b < nb; b++) first[b] = -1;
    for (int n = 0; n < g->n_nodes; n++) {
        int b = g->nodes[n].block;
        if (b < 0) continue;
        if (first[b] < 0) first[b] = n;
        last[b] = n;
    }
    for (int b = 0; b < nb; b++) {
        int lo = b, hi = b;
        for (int n = first[b]; n >= 0 && n <= last[b]; n++) {
            int c = g->nodes[n].block;
            if (c >= 0 && c < lo) lo = c;
            if (c > hi) hi = c;
        }
        for (int j = lo + 1; j <= hi; j++)
            if (s->cut_ok[j]) s->cut_ok[j] = 0, s->cut_by[j] = b;
    }
}

/* An explicit balance that cuts between blocks j - 1 and j, which a shared block keeps together. */
static void cut_error(Split *s, Diag *d, int j, const char *balance)
{
    const Graph *g = s->g;
    const Block *b = &g->blocks[s->cut_by[j]];
    diag_error(d, (Loc){0}, "balance '%s' puts blocks %s and %s on different %s, but shared instance %s (a %s "
               "applied more than once) keeps them together: its applications, and every block between them, "
               "sit on one stage", balance, g->blocks[j - 1].name, g->blocks[j].name,
               s->V > 1 ? "chunks" : "stages", b->name, b->layer);
}

/* blocks per stage from "3,3,2"; 0, or -1 after an error. */
static int explicit_balance(Split *s, const char *text, Diag *d)
{
    Graph *g = s->g;
    int n = 0, at = 0;
    for (const char *p = text; *p;) {
        char *end;
        long k = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',')) {
            diag_error(d, (Loc){0}, "balance '%s': expected auto or blocks per stage, like 3,3,2", text);
            return -1;
        }
        if (n == s->PV) {
            diag_error(d, (Loc){0}, "balance '%s' lists more than the %d %s", text, s->PV, s->V > 1 ? "chunks" : "stages");
            return -1;
        }
        if (k < 1) {
            diag_error(d, (Loc){0}, "balance '%s': %s %d has %ld blocks; every %s needs at least one", text,
                       s->V > 1 ? "chunk" : "stage", n, k, s->V > 1 ? "chunk" : "stage");
            return -1;
        }
        for (long i = 0; i < k && at + i < g->n_blocks; i++) s->stage_of_block[at + i] = n;
        at += (int)k, n++;
        p = *end ? end + 1 : end;
    }
    if (n != s->PV || at != g->n_blocks) {
        diag_error(d, (Loc){0}, "balance '%s' places %d blocks on %d %s; the model has %d blocks and the plan %d %s",
                   text, at, n, s->V > 1 ? "chunks" : "stages", g->n_blocks, s->PV,
                   s->V > 1 ? "chunks (stages x chunks)" : "stages");
        return -1;
    }
    for (int j = 1; j < g->n_blocks; j++)
        if (s->stage_of_block[j] != s->stage_of_block[j - 1] && !s->cut_ok[j]) {
            cut_error(s, d, j, text);
            return -1;
        }
    return 0;
}

typedef struct {
    double time, mem;
} Cost;

/* Each block's forward FLOPs and activation bytes, its params' bytes; the time outside
 * blocks that the first and the last stage carry. */
static void block_costs(const Split *s, double *flops, double *act, double *par, double *first, double *last)
{
    const Graph *g = s->g;
    for (int n = 0; n < g->n_nodes; n++) {
        const Node *node = ir_node(g, n);
        double f = ir_op_hooks(node->op)->flops(g, node);
        if (node->block >= 0) {
            flops[node->block] += f;
            for (int i = 0; i < node->n_out; i++) act[node->block] += (double)ir_nbytes(ir_value(g, ir_out(g, node, i)));
        } else if (s->stage[n] < 0) {
            *first += f;
        } else {
            *last += f;
        }
    }
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].role == ROLE_PARAM && g->values[v].block >= 0) par[g->values[v].block] += 16.0 * (double)ir_numel(&g->values[v]);
}

/* Blocks [i, j) as chunk st (a stage, but for interleaved). */
static Cost stage_cost(const Split *s, const TrainConfig *t, const double *pf, const double *pa, const double *pp,
                       double first, double last, int st, int i, int j)
{
    int M = t->microbatches, one_f = t->schedule == SCHED_1F1B || t->schedule == SCHED_ZB1;
    int held = !one_f ? M : (s->P - st < M ? s->P - st : M);
    Cost c = {pf[j] - pf[i], (pp[j] - pp[i]) + held * (pa[j] - pa[i])};
    if (st == 0) c.time += first;
    if (st == s->PV - 1) c.time += last;
    return c;
}

/* The contiguous cut of `nb` blocks into P stages that minimizes the slowest stage's
 * time (limit < 0), or the largest stage's memory among cuts whose every stage takes at
 * most `limit`; the best value, the cut into stage_of_block. */
static double best_cut(Split *s, const TrainConfig *t, const double *pf, const double *pa, const double *pp,
                       double first, double last, double limit)
{
    int P = s->PV, nb = s->g->n_blocks;
    double *best = arena_alloc(s->g->arena, sizeof(double) * (size_t)(P + 1) * (size_t)(nb + 1));
    int *from = arena_alloc(s->g->arena, sizeof(int) * (size_t)(P + 1) * (size_t)(nb + 1));
#define AT(a, st, j) a[(size_t)(st) * (size_t)(nb + 1) + (size_t)(j)]
    for (int st = 0; st <= P; st++)
        for (int j = 0; j <= nb; j++) AT(best, st, j) = -1;
    AT(best, 0, 0) = 0;
    for (int st = 0; st < P; st++)
        for (int i = st; i <= nb; i++) {
            if (AT(best, st, i) < 0) continue;
            for (int j = i + 1; j <= nb - (P - st - 1); j++) {
                if (j < nb && !s->cut_ok[j]) continue;
                Cost c = stage_cost(s, t, pf, pa, pp, first, last, st, i, j);
                if (limit >= 0 && c.time > limit) continue;
                double v = limit < 0 ? c.time : c.mem;
                if (AT(best, st, i) > v) v = AT(best, st, i);
                if (AT(best, st + 1, j) < 0 || v < AT(best, st + 1, j)) AT(best, st + 1, j) = v, AT(from, st + 1, j) = i;
            }
        }
    double result = AT(best, P, nb);
    if (result >= 0)
        for (int st = P, j = nb; st > 0; st--) {
            int i = AT(from, st, j);
            for (int b = i; b < j; b++) s->stage_of_block[b] = st - 1;
            j = i;
        }
#undef AT
    return result;
}

static int auto_balance(Split *s, const TrainConfig *t, Diag *d)
{
    Graph *g = s->g;
    int nb = g->n_blocks;
    double *flops = arena_alloc(g->arena, sizeof(double) * (size_t)nb + 1);
    double *act = arena_alloc(g->arena, sizeof(double) * (size_t)nb + 1);
    double *par = arena_alloc(g->arena, sizeof(double) * (size_t)nb + 1);
    double first = 0, last = 0;
    block_costs(s, flops, act, par, &first, &last);
    /* Prefix sums, so a stage's cost is two lookups. */
    double *pf = arena_alloc(g->arena, sizeof(double) * (size_t)(nb + 1));
    double *pa = arena_alloc(g->arena, sizeof(double) * (size_t)(nb + 1));
    double *pp = arena_alloc(g->arena, sizeof(double) * (size_t)(nb + 1));
    for (int b = 0; b < nb; b++) pf[b + 1] = pf[b] + flops[b], pa[b + 1] = pa[b] + act[b], pp[b + 1] = pp[b] + par[b];
    double fastest = best_cut(s, t, pf, pa, pp, first, last, -1);
    if (fastest < 0) {
        int n = 0;
        for (int j = 1; j < nb; j++) n += s->cut_ok[j];
        diag_error(d, (Loc){0}, "%d %s need %d cuts between blocks, but the model has %d where one may fall: a "
                   "shared instance (a block applied more than once) keeps the blocks between its applications on "
                   "its stage", s->PV, s->V > 1 ? "chunks" : "stages", s->PV - 1, n);
        return -1;
    }
    best_cut(s, t, pf, pa, pp, first, last, fastest * 1.02);
    return 0;
}

/* ---- where each node runs ----------------------------------------------------------- */

/* Free nodes (stage -1), block nodes on their block's stage, the rest on the latest stage
 * among their inputs. */
static void assign(Split *s)
{
    Graph *g = s->g;
    for (int n = 0; n < g->n_nodes; n++) {
        const Node *node = ir_node(g, n);
        if (node->block >= 0) {
            s->stage[n] = s->stage_of_block[node->block];
            continue;
        }
        int st = -1;
        for (int i = 0; i < node->n_in; i++) {
            int p = ir_value(g, ir_in(g, node, i))->producer;
            if (p >= 0 && s->stage[p] > st) st = s->stage[p];
        }
        s->stage[n] = st;
    }
}

/* Which stages read each value, and on which stages each free node runs: where a stage
 * reads its outputs, directly or through other free nodes. The outputs are the last
 * stage's. */
static void read_by(int *r, int chunk)
{
    if (!*r || chunk + 1 < *r) *r = chunk + 1;
}

static void find_readers(Split *s)
{
    Graph *g = s->g;
    size_t nn = (size_t)g->n_nodes, nv = (size_t)g->n_values;
    for (int i = 0; i < g->n_outputs; i++) read_by(&s->reads[(size_t)(s->P - 1) * nv + (size_t)g->outputs[i]], s->PV - 1);
    for (int n = g->n_nodes - 1; n >= 0; n--) {
        const Node *node = ir_node(g, n);
        for (int st = 0; st < s->P; st++) {
            int chunk = s->stage[n] >= 0 && s->stage[n] % s->P == st ? s->stage[n] : -1;
            for (int i = 0; i < node->n_out && chunk < 0 && s->stage[n] < 0; i++) {
                int r = s->reads[(size_t)st * nv + (size_t)ir_out(g, node, i)];
                if (r) chunk = r - 1;
            }
            if (chunk < 0) continue;
            if (s->stage[n] < 0) read_by(&s->needs[(size_t)st * nn + (size_t)n], chunk);
            for (int i = 0; i < node->n_in; i++) read_by(&s->reads[(size_t)st * nv + (size_t)ir_in(g, node, i)], chunk);
        }
    }
}

/* ---- the stage graphs --------------------------------------------------------------- */

/* v (a param, input, or state: no producer) in stage st's graph. */
static int copy_value(Split *s, int st, int v)
{
    int *vm = vmap_of(s, st);
    if (vm[v] < 0) {
        vm[v] = ir_value_add(s->sg[st], ir_value(s->g, v));
        s->sg[st]->values[vm[v]].step_role = ir_value(s->g, v)->step_role;
    }
    return vm[v];
}

static void add_link(Graph *sg, int value, int peer, int sends, int tag)
{
    sg->links = arena_grow(sg->arena, sg->links, &sg->cap_links, sg->n_links + 1, sizeof *sg->links);
    sg->links[sg->n_links++] = (PipeLink){value, peer, sends, tag};
}

static int add_node(Graph *sg, OpKind op, const int *in, int n_in, const Attr *attrs, int n_attr, int block, Phase ph,
                    Loc loc, int chunk)
{
    char err[256];
    int n = ir_node_add(sg, op, in, n_in, attrs, n_attr, block, ph, loc, err, sizeof err);
    if (n < 0) fprintf(stderr, "stages: %s\n", err);
    FS_ASSERT(n >= 0);
    sg->nodes[n].chunk = chunk;
    return n;
}

/* Stage b receives, in the order stage a sent them, every value up to v, for chunk
 * `chunk`'s forward. */
static void receive_through(Split *s, int a, int b, int v, int chunk)
{
    Graph *sg = s->sg[b];
    while (vmap_of(s, b)[v] < 0) {
        int w = dequeue(s, a, b);
        const Value *val = ir_value(s->g, w);
        int64_t shape[IR_MAX_RANK];
        for (int d = 0; d < val->rank; d++) shape[d] = val->shape[d];
        int tag = s->stage[val->producer];  // the chunk that made it
        Attr at[4] = {{.key = "shape", .kind = ATTR_INTS, .ints = shape, .n_list = val->rank},
                      {.key = "dtype", .kind = ATTR_INT, .i = val->dtype},
                      {.key = "peer", .kind = ATTR_INT, .i = a}, {.key = "tag", .kind = ATTR_INT, .i = tag}};
        int n = add_node(sg, OP_recv, NULL, 0, at, 4, -1, PHASE_FORWARD, val->loc, chunk);
        int r = ir_out(sg, ir_node(sg, n), 0);
        sg->values[r].name = val->name;
        vmap_of(s, b)[w] = r;
        add_link(sg, r, a, 0, tag);
    }
}

/* Node n of the graph, on stage st, in model chunk `chunk`. */
static void place(Split *s, int st, int n, int chunk)
{
    Graph *g = s->g, *sg = s->sg[st];
    Node node = *ir_node(g, n);
    int in[IR_MAX_IN];
    for (int i = 0; i < node.n_in; i++) {
        int v = ir_in(g, &node, i), p = ir_value(g, v)->producer;
        if (vmap_of(s, st)[v] < 0) {
            if (p < 0)
                copy_value(s, st, v);
            else
                receive_through(s, s->stage[p] % s->P, st, v, chunk);
        }
        in[i] = vmap_of(s, st)[v];
    }
    Attr attrs[IR_MAX_PARAMS];
    ir_node_attrs(g, &node, attrs);
    int c = add_node(sg, node.op, in, node.n_in, attrs, node.n_attr, node.block, node.phase, node.loc, chunk);
    sg->nodes[c].use = node.use;
    for (int i = 0; i < node.n_out; i++) {
        int v = ir_out(g, &node, i), w = ir_out(sg, ir_node(sg, c), i);
        sg->values[w].role = g->values[v].role;
        sg->values[w].place = g->values[v].place;
        sg->values[w].name = g->values[v].name;
        vmap_of(s, st)[v] = w;
        if (s->stage[n] < 0) continue;  // free: every stage that reads it makes its own
        for (int r = 0; r < s->P; r++) {
            if (r == st || !s->reads[(size_t)r * (size_t)g->n_values + (size_t)v]) continue;
            Attr at[2] = {{.key = "peer", .kind = ATTR_INT, .i = r}, {.key = "tag", .kind = ATTR_INT, .i = chunk}};
            add_node(sg, OP_send, &w, 1, at, 2, node.block, PHASE_FORWARD, node.loc, chunk);
            add_link(sg, w, r, 1, chunk);
            enqueue(s, st, r, v);
        }
    }
}

/* Params that several stage graphs hold: each lists the others; all but the first
 * stage leave it out of their gradient norm. */
static void find_tied(Split *s)
{
    Graph *g = s->g;
    int *stages = arena_alloc(g->arena, sizeof(int) * (size_t)s->P);
    for (int v = 0; v < g->n_values; v++) {
        if (g->values[v].role != ROLE_PARAM) continue;
        int n = 0;
        for (int st = 0; st < s->P; st++)
            if (vmap_of(s, st)[v] >= 0) stages[n++] = st;
        if (n < 2) continue;
        for (int k = 0; k < n; k++) {
            Graph *sg = s->sg[stages[k]];
            int *list = arena_alloc(sg->arena, sizeof(int) * (size_t)n);
            memcpy(list, stages, sizeof(int) * (size_t)n);
            sg->tied = arena_grow(sg->arena, sg->tied, &sg->cap_tied, sg->n_tied + 1, sizeof *sg->tied);
            sg->tied[sg->n_tied++] = (TiedParam){vmap_of(s, stages[k])[v], n, list};
            sg->values[vmap_of(s, stages[k])[v]].pipe_copy = k > 0;
        }
    }
}

static int check_settings(const Graph *g, const TrainConfig *t, Diag *d)
{
    int P = t->stages, M = t->microbatches, V = t->chunks;
    if (t->schedule == SCHED_INTERLEAVED) {
        if (V < 2)
            diag_error(d, (Loc){0}, "schedule interleaved with chunks %d: each stage needs at least 2 model chunks "
                       "(--chunks 2)", V);
        else if (g->n_blocks < P * V)
            diag_error(d, (Loc){0}, "stages %d x chunks %d = %d model chunks: the model has %d block%s, and every chunk "
                       "needs at least one", P, V, P * V, g->n_blocks, g->n_blocks == 1 ? "" : "s");
        if (M % P) {
            char use[64];
            if (M > P)
                snprintf(use, sizeof use, "%d or %d", M / P * P, (M / P + 1) * P);
            else
                snprintf(use, sizeof use, "%d", P);
            diag_error(d, (Loc){0}, "schedule interleaved with microbatches %d and stages %d: the micro-batches go "
                       "round the stages in groups of %d, so microbatches must be a multiple of the stages "
                       "(Megatron's rule); use microbatches %s", M, P, P, use);
        }
    } else if (g->n_blocks < P) {
        diag_error(d, (Loc){0}, "stages %d: the model has %d block%s, and every stage needs at least one", P,
                   g->n_blocks, g->n_blocks == 1 ? "" : "s");
    }
    if ((t->schedule == SCHED_1F1B || t->schedule == SCHED_ZB1) && M < P)
        diag_error(d, (Loc){0}, "schedule %s with microbatches %d < stages %d: %s needs at least as many "
                   "micro-batches as stages; use microbatches >= %d, or schedule gpipe", sched_name(t->schedule), M, P,
                   t->schedule == SCHED_ZB1 ? "ZB-H1" : "1F1B", P);
    if (t->chunks > 1 && t->schedule != SCHED_INTERLEAVED)
        diag_error(d, (Loc){0}, "chunks %d: model chunks per stage are for schedule interleaved only", t->chunks);
    if (strcmp(t->recompute, "none") && t->checkpoint != CKPT_NEVER)
        diag_error(d, (Loc){0}, "recompute %s with checkpoint %s: with pipeline stages, checkpoint decides what is "
                   "recomputed (the whole stage, per micro-batch); set checkpoint never to recompute blocks instead",
                   t->recompute, checkpoint_name(t->checkpoint));
    return d->n_errors ? -1 : 0;
}

int pass_stages(Graph *g, const Options *o, Diag *d)
{
    const TrainConfig *t = &o->train;
    if (t->stages <= 1) return 0;
    if (check_settings(g, t, d)) return -1;
    int P = t->stages, V = t->schedule == SCHED_INTERLEAVED ? t->chunks : 1;
    size_t nv = (size_t)g->n_values, nn = (size_t)g->n_nodes;
    Split s = {.g = g, .P = P, .V = V, .PV = P * V};
    s.stage_of_block = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_blocks + 1);
    s.stage = arena_alloc(g->arena, sizeof(int) * nn + 1);
    s.needs = arena_alloc(g->arena, sizeof(int) * (size_t)P * nn + 1);
    s.reads = arena_alloc(g->arena, sizeof(int) * (size_t)P * nv + 1);
    s.vmap = arena_alloc(g->arena, sizeof(int) * (size_t)P * nv + 1);
    s.q_head = arena_alloc(g->arena, sizeof(int) * (size_t)P * (size_t)P);
    s.q_tail = arena_alloc(g->arena, sizeof(int) * (size_t)P * (size_t)P);
    memset(s.vmap, -1, sizeof(int) * (size_t)P * nv);
    memset(s.q_head, -1, sizeof(int) * (size_t)P * (size_t)P);
    memset(s.q_tail, -1, sizeof(int) * (size_t)P * (size_t)P);
    find_cuts(&s);
    if (strcmp(t->balance, "auto")) {
        if (explicit_balance(&s, t->balance, d)) return -1;
        assign(&s);
    } else {
        for (int b = 0; b < g->n_blocks; b++) s.stage_of_block[b] = 0;
        assign(&s);  // free nodes are known before the cut: they do not depend on it
        if (auto_balance(&s, t, d)) return -1;
        assign(&s);
    }
    find_readers(&s);

    s.sg = arena_alloc(g->arena, sizeof(Graph *) * (size_t)P);
    g->stage_graphs = s.sg;  // the graph owns them from here (ir_graph_free), errors or not
    g->n_stage_graphs = P;
    for (int st = 0; st < P; st++) {
        Graph *sg = s.sg[st] = ir_graph_new(g->model);
        sg->stage = st, sg->n_stages = P, sg->n_chunks = V;
        for (int b = 0; b < g->n_blocks; b++) ir_block_add(sg, g->blocks[b].name, g->blocks[b].layer, g->blocks[b].index);
        if (g->loss_scale >= 0) sg->loss_scale = copy_value(&s, st, g->loss_scale);
        if (g->scale_good >= 0) sg->scale_good = copy_value(&s, st, g->scale_good);
    }
    for (int n = 0; n < g->n_nodes; n++)
        for (int st = 0; st < P; st++) {
            if (s.stage[n] >= 0 && s.stage[n] % P == st)
                place(&s, st, n, s.stage[n]);
            else if (s.stage[n] < 0 && s.needs[(size_t)st * nn + (size_t)n])
                place(&s, st, n, s.needs[(size_t)st * nn + (size_t)n] - 1);
        }
    for (int i = 0; i < g->n_outputs; i++) {
        int v = g->outputs[i], p = ir_value(g, v)->producer;
        if (p >= 0 && s.stage[p] >= 0 && s.stage[p] != s.PV - 1) {
            if (i == 0) {
                diag_error(d, ir_value(g, v)->loc, "the loss is computed in model chunk %d of %d; it must be in the last",
                           s.stage[p], s.PV);
                continue;
            }
            if (s.stage[p] % P != P - 1) receive_through(&s, s.stage[p] % P, P - 1, v, s.PV - 1);  // the last stage's
        }
        ir_output_add(s.sg[P - 1], vmap_of(&s, P - 1)[v] >= 0 ? vmap_of(&s, P - 1)[v] : copy_value(&s, P - 1, v));
    }
    find_tied(&s);
    return d->n_errors ? -1 : 0;
}
