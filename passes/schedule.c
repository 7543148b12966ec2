/* passes/schedule.c: the streams every node runs on and every wait between them, decided
 * once, here, and stored in the plan; the backends execute them as stored and never look
 * for hazards at run time.
 *
 * Needs: every node (every pass that adds nodes ran before it); fsdp's all-gathers where
 *        the shard pass put them, at the first node of each run that reads them.
 * Gives: the final node order (prefetch), Node.stream, and Node.wait / n_wait: for each
 *        node, the nodes on other streams it must not start before. memplan reads the
 *        waits to keep a collective's buffers until it is complete.
 *
 * Prefetch (FairScale's forward and backward prefetch): in each run of forward nodes or
 * of the others (backward, recompute), the gathers of fsdp's units are taken in the
 * order the run first reads them, and each but the first moves, with the cast that feeds
 * it (with offload params: the shard's copy to the device and its cast on the host), to
 * just before the first reader of the one before it: a block's params arrive while the
 * previous block computes. Offload's once-a-step copies of the params to the device
 * (with their cast on the host) are prefetched the same way. The gathered buffers then
 * live that much longer, which memplan counts.
 *
 * Offload's host work, before prefetch (host_early): each optimizer node of the compute
 * stream and each copy to the host goes just after the last node it must follow, and an
 * update on the host one gradient copy further, so a unit's host update is issued after the next
 * unit's backward and copy (on CUDA ranks the host runs it while the device computes
 * that). Updates that read the global norm stay after the backward. A delayed update
 * (delayed_update: passes/offload.c put it after its master's copy to the device, and it
 * reads only what the step before left on the host) stays where it is, during the step's
 * forward and backward, and so do the copies to the host, which write what the next
 * step's updates read: after every update of this one.
 *
 * The streams, from the op table's flags: collectives (and point-to-point) on
 * STREAM_COLLECTIVE, host-device copies (OPF_COPY: offload's) on STREAM_COPY,
 * everything else on STREAM_COMPUTE. Semantics, the same on every backend: the nodes of
 * one stream run in order; a node off the compute stream starts after every compute node
 * before it (its inputs are then made); a node starts after the nodes its waits name. At
 * the end of the step every stream is complete. An op of the host space (offload's
 * update and casts) touches host bytes only, which only copies and host ops touch: it
 * runs after the host ops before it and waits for the earlier copies no earlier host op
 * waited for that touch its buffers or go to the device, not for the device's compute.
 *
 * An op off the compute stream (a collective) is in flight from its node until the first
 * later node that reads or writes one of its buffers: that node waits for it. A send
 * (pipeline stages) is in flight at most until the stage has heard back from the same
 * peer (its next receive from it; with V model chunks per stage, interleaved, its V-th):
 * the first compute node after that receive waits for it, so its buffer is freed within
 * a micro-batch or two rather than at the step's end (plan_check_p2p proves the waits
 * cannot deadlock). A reduce-scatter (zero2's, fsdp's gradients) is in flight at most
 * until the next one starts: the first compute node after that waits for it, so the
 * block's full gradient buffer is free a block later, not at the step's end (ZeRO-2's
 * saving), and it has had a block's backward to finish. "Reads or
 * writes" is by buffer (the root every view lies in, as memplan lays them out), not by
 * bytes, so the waits do not depend on offsets. A view op computes nothing (its output
 * lies in its input's bytes), so it never waits. An op no later node touches is complete
 * at the end of the step; memplan keeps its buffers until then.
 */
#include <stdlib.h>
#include <string.h>

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

/* What prefetch moves: an fsdp gather (an all-gather into a unit's gathered params), or
 * offload's copy of params to the device that compute reads (the staging copy a gather
 * reads moves with its gather instead; zero1's and zero2's stays before their all-gather). */
static int is_gather(const Graph *g, int k, const char *read_by_collective)
{
    const Node *n = ir_node(g, k);
    if (n->op != OP_all_gather && n->op != OP_to_device) return 0;
    int out = ir_out(g, n, 0);
    return ir_value(g, out)->role == ROLE_GATHERED && (n->op == OP_all_gather || !read_by_collective[out]);
}

/* What a gather reads, when nothing else reads it, moves with it: its cast, or offload's
 * copy of the shard to the device and the cast on the host before it. */
enum { MAX_FEED = 2 };

typedef struct {
    int node;             // the gather
    int feed[MAX_FEED];   // the nodes that move with it, nearest first
    int n_feed;
} Gather;

static Gather gather_of(const Graph *g, int k, const int *readers)
{
    Gather gs = {.node = k};
    for (int x = ir_in(g, ir_node(g, k), 0); gs.n_feed < MAX_FEED;) {
        int c = ir_value(g, x)->producer;
        if (c < 0 || readers[x] != 1 || ir_node(g, c)->n_in != 1) break;
        if (ir_node(g, c)->op != OP_cast && !(op_info(ir_node(g, c)->op)->flags & OPF_COPY)) break;
        gs.feed[gs.n_feed++] = c;
        x = ir_in(g, ir_node(g, c), 0);
    }
    return gs;
}

/* A gathered buffer's first reader in a run. */
typedef struct {
    int gather;      // index in the gathers
    int run, first;  // the run, and its first node that reads the buffer
    int own;         // the run the gather serves: its buffer's first read
} Read;

static int by_run_then_first(const void *a, const void *b)
{
    const Read *x = a, *y = b;
    if (x->run != y->run) return x->run - y->run;
    return x->first != y->first ? x->first - y->first : x->gather - y->gather;
}

/* Where each gather goes (before[i]: the node it goes before): each run's buffers in the
 * order the run first reads them, and each gather serving a run just before the first
 * read of the buffer read before its own in that run (a buffer gathered in an earlier run
 * counts: fsdp keeps the params outside blocks for the whole step). */
static void prefetch_points(Graph *g, const int *root, const char *moves, const int *run, const Gather *gs, int ng,
                            int *before)
{
    int nn = g->n_nodes, nr = 0;
    Read *reads = arena_alloc(g->arena, sizeof(Read) * ((size_t)ng * 4 + 16));
    int cap = ng * 4 + 16;
    for (int i = 0; i < ng; i++) {
        int buf = root[ir_out(g, ir_node(g, gs[i].node), 0)], last = -1;
        before[i] = -1;
        for (int k = gs[i].node + 1; k < nn; k++) {
            if (moves[k] || run[k] == last || !touches(g, ir_node(g, k), root, buf, buf)) continue;
            if (nr == cap) reads = arena_grow(g->arena, reads, &cap, nr + 1, sizeof *reads);
            reads[nr++] = (Read){i, run[k], k, last < 0};
            last = run[k];
        }
        if (last < 0)  // read by nobody: it stays before the node after it
            for (int k = gs[i].node + 1; k <= nn && before[i] < 0; k++)
                if (k == nn || !moves[k]) before[i] = k;
    }
    qsort(reads, (size_t)nr, sizeof *reads, by_run_then_first);
    for (int r = 0; r < nr; r++) {
        if (!reads[r].own) continue;
        int prev = r && reads[r - 1].run == reads[r].run ? reads[r - 1].first : reads[r].first;
        before[reads[r].gather] = prev < reads[r].first ? prev : reads[r].first;
    }
}

/* A delayed update (delayed_update) follows the copy of its master to the device where
 * prefetch takes that: it goes before the same node, after the last gather whose group
 * reads its master. (Without it, an update reads this step's gradient: it is after the
 * backward, far behind any gather.) */
static void updates_follow(const Graph *g, const int *root, const Gather *gs, int ng, const int *before, char *moves,
                           int *due)
{
    for (int u = 0; u < g->n_nodes; u++) {
        const Node *un = ir_node(g, u);
        if (!ops_is_update(un->op)) continue;
        // adamw_cast / sgd_cast: the copy sends w, the 16-bit params it writes, not the master
        int at16 = ops_update_copy_input(un->op);
        int master = root[ir_in(g, un, 0)], w = at16 >= 0 ? root[ir_in(g, un, at16)] : master, at = -1;
        for (int i = 0; i < ng; i++)
            for (int f = -1; f < gs[i].n_feed; f++) {
                const Node *x = ir_node(g, f < 0 ? gs[i].node : gs[i].feed[f]);
                if (touches(g, x, root, master, w) && before[i] > at) at = before[i];
            }
        if (at >= 0) moves[u] = 1, due[u] = at;
    }
}

static void prefetch(Graph *g, const int *root, int delayed)
{
    int nn = g->n_nodes;
    int *readers = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_values + 1);
    char *read_by_collective = arena_alloc(g->arena, (size_t)g->n_values + 1);
    for (int k = 0; k < nn; k++)
        for (int i = 0; i < ir_node(g, k)->n_in; i++) {
            readers[ir_in(g, ir_node(g, k), i)]++;
            if (op_info(ir_node(g, k)->op)->flags & OPF_COLLECTIVE) read_by_collective[ir_in(g, ir_node(g, k), i)] = 1;
        }
    char *moves = arena_alloc(g->arena, (size_t)nn + 1);
    Gather *gs = arena_alloc(g->arena, sizeof(Gather) * (size_t)nn + 1);
    int ng = 0;
    for (int k = 0; k < nn; k++)
        if (is_gather(g, k, read_by_collective)) {
            gs[ng] = gather_of(g, k, readers);
            moves[k] = 1;
            for (int f = 0; f < gs[ng].n_feed; f++) moves[gs[ng].feed[f]] = 1;
            ng++;
        }
    if (!ng) return;
    /* Runs over the nodes that stay: stretches of one phase class, forward or not. */
    int *run = arena_alloc(g->arena, sizeof(int) * (size_t)nn + 1), r = -1, cls = -1;
    for (int k = 0; k < nn; k++) {
        if (moves[k]) continue;
        int c = ir_node(g, k)->phase != PHASE_FORWARD;
        if (c != cls) r++, cls = c;
        run[k] = r;
    }
    int *before = arena_alloc(g->arena, sizeof(int) * (size_t)ng + 1);
    prefetch_points(g, root, moves, run, gs, ng, before);
    /* Each moved node goes before its group's node; there, the moved ones in their order
     * (a counting sort by that node, stable). */
    int *due = arena_alloc(g->arena, sizeof(int) * (size_t)nn + 1);
    int *start = arena_alloc(g->arena, sizeof(int) * (size_t)(nn + 2));
    for (int i = 0; i < ng; i++) {
        due[gs[i].node] = before[i];
        for (int f = 0; f < gs[i].n_feed; f++) due[gs[i].feed[f]] = before[i];
    }
    if (delayed) updates_follow(g, root, gs, ng, before, moves, due);
    int n_moved = 0;
    for (int k = 0; k < nn; k++)
        if (moves[k]) start[due[k] + 1]++, n_moved++;
    for (int k = 0; k <= nn; k++) start[k + 1] += start[k];
    int *moved = arena_alloc(g->arena, sizeof(int) * (size_t)nn + 1);
    for (int k = 0; k < nn; k++)
        if (moves[k]) moved[start[due[k]]++] = k;
    int *order = arena_alloc(g->arena, sizeof(int) * (size_t)nn + 1), n = 0, m = 0;
    for (int k = 0; k <= nn; k++) {
        while (m < n_moved && due[moved[m]] == k) order[n++] = moved[m++];
        if (k < nn && !moves[k]) order[n++] = k;
    }
    FS_ASSERT(n == nn);
    ir_nodes_reorder(g, order);
}

static void add_wait(Graph *g, Node *n, int on)
{
    g->waits = arena_grow(g->arena, g->waits, &g->cap_waits, g->n_waits + 1, sizeof *g->waits);
    if (!n->n_wait) n->wait = g->n_waits;
    FS_ASSERT(n->wait + n->n_wait == g->n_waits);  // a node's waits are added together
    g->waits[g->n_waits++] = on;
    n->n_wait++;
}

/* The stream an op runs on, from its flags in the op table (ops/ops.def). */
static Stream stream_of(OpKind op)
{
    int f = op_info(op)->flags;
    return f & (OPF_COLLECTIVE | OPF_P2P) ? STREAM_COLLECTIVE : f & OPF_COPY ? STREAM_COPY : STREAM_COMPUTE;
}

/* Whether node n reads or writes a buffer that node c reads or writes. */
static int shares_a_buffer(const Graph *g, const Node *n, const Node *c, const int *root)
{
    for (int i = 0; i < c->n_in + c->n_out; i++) {
        int r = root[i < c->n_in ? ir_in(g, c, i) : ir_out(g, c, i - c->n_in)];
        if (touches(g, n, root, r, r)) return 1;
    }
    return 0;
}

/* ---- offload's host updates ------------------------------------------------------------- */

/* An op of the host space: not a copy, and it reads (or writes) host bytes only. */
static int on_host(const Graph *g, const Node *n)
{
    return !(op_info(n->op)->flags & OPF_COPY) && n->n_in + n->n_out > 0 &&
           ir_value(g, n->n_in ? ir_in(g, n, 0) : ir_out(g, n, 0))->place == PLACE_HOST;
}

static int is_to_host(const Graph *g, const Node *n)
{
    return n->op == OP_to_host && ir_value(g, ir_out(g, n, 0))->role == ROLE_GRAD;
}


/* Whether x must stay after y: they share a buffer, unless both are updates, which
 * share only what both read (the learning rate, the coefficient, the step count). */
static int must_follow(const Graph *g, const Node *x, const Node *y, const int *root)
{
    return !(ops_is_update(x->op) && ops_is_update(y->op)) && shares_a_buffer(g, x, y, root);
}

/* Offload's updates during the backward: each optimizer node of the compute stream and
 * each copy to the host goes, in order, just after the last node before it that it must
 * follow (nothing it reads is made later, nothing it writes is read or written later
 * before it); a host update then goes one gradient copy further, so the device has the
 * next unit's backward queued while the host updates this unit. Where an update reads
 * the global norm (clipping, a loss scale) that is after the backward, as before. */
static void host_early(Graph *g, const int *root, int delayed)
{
    int nn = g->n_nodes, n = 0, any = 0;
    for (int k = 0; k < nn && !any; k++) any = on_host(g, ir_node(g, k));
    if (!any) return;
    int *order = arena_alloc(g->arena, sizeof(int) * (size_t)nn + 1);
    for (int k = 0; k < nn; k++) {
        const Node *x = ir_node(g, k);
        /* A collective or a send stays: the order of those between ranks is what
         * plan_check_p2p proved free of deadlock. */
        int optimizer = x->phase == PHASE_OPTIMIZER && stream_of(x->op) == STREAM_COMPUTE;
        int moves = delayed ? optimizer && !ops_is_update(x->op) : optimizer || x->op == OP_to_host;
        int at = n;  // the position it goes to
        if (moves) {
            while (at > 0 && !must_follow(g, x, ir_node(g, order[at - 1]), root)) at--;
            if (on_host(g, x) && !delayed) {
                int c = at;
                while (c < n && !is_to_host(g, ir_node(g, order[c]))) c++;
                if (c < n) at = c + 1;
            }
        }
        memmove(order + at + 1, order + at, sizeof(int) * (size_t)(n - at));
        order[at] = k, n++;
    }
    ir_nodes_reorder(g, order);
}

/* A host op's waits: every copy before it that touches its buffers, and every copy to
 * the device before it (memplan may give the host bytes it reads to a value this op
 * writes once a device op has waited for it), that no host op before it waited for.
 * The host runs its ops in order, but it does not wait for the device's compute, so a
 * wait a device op took for a copy does not order the host. (A copy to the host writes
 * a buffer a host op reads, which that op waits for.) */
static void host_waits(Graph *g, int k, const int *root, char *host_saw)
{
    Node *n = &g->nodes[k];
    for (int c = 0; c < k; c++) {
        const Node *q = ir_node(g, c);
        if (!(op_info(q->op)->flags & OPF_COPY) || host_saw[c]) continue;
        if (q->op != OP_to_device && !shares_a_buffer(g, n, q, root)) continue;
        int have = 0;
        for (int i = 0; i < n->n_wait; i++) have |= g->waits[n->wait + i] == c;
        if (!have) add_wait(g, n, c);
        host_saw[c] = 1;
    }
}

int pass_schedule(Graph *g, const Options *o, Diag *d)
{
    (void)d;
    int *root = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_values + 1);
    for (int v = 0; v < g->n_values; v++) root[v] = root_of(g, v);
    host_early(g, root, o->train.delayed_update);
    prefetch(g, root, o->train.delayed_update);
    int *pending = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_nodes + 1), n_pending = 0;
    int *heard = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_nodes + 1);  // a send's: receives from its peer since
    char *overtaken = arena_alloc(g->arena, (size_t)g->n_nodes + 1);  // a reduce-scatter's: another started since
    char *host_saw = arena_alloc(g->arena, (size_t)g->n_nodes + 1);  // a copy's: a host op waited for it
    int rounds = g->n_chunks > 1 ? g->n_chunks : 1;
    g->n_waits = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        Node *n = &g->nodes[k];
        n->stream = stream_of(n->op);
        n->wait = n->n_wait = 0;
        if (is_view_node(n)) continue;
        int host = on_host(g, n);
        /* In flight, in the order they started: a node waits for them in that order. */
        int kept = 0;
        for (int j = 0; j < n_pending; j++) {
            int p = pending[j];
            int due = n->stream == STREAM_COMPUTE && !host && (heard[p] >= rounds || overtaken[p]);
            if (shares_a_buffer(g, n, ir_node(g, p), root) || due) add_wait(g, n, p);
            else
                pending[kept++] = p;
        }
        n_pending = kept;
        if (host) host_waits(g, k, root, host_saw);
        if (n->op == OP_recv)  // the peer answered
            for (int j = 0; j < n_pending; j++) {
                const Node *q = ir_node(g, pending[j]);
                heard[pending[j]] += q->op == OP_send && ir_attr_int(g, q, "peer", -1) == ir_attr_int(g, n, "peer", -2);
            }
        if (n->op == OP_reduce_scatter)  // the ones before it are complete by the next compute node
            for (int j = 0; j < n_pending; j++) overtaken[pending[j]] |= ir_node(g, pending[j])->op == OP_reduce_scatter;
        if (n->stream != STREAM_COMPUTE) pending[n_pending++] = k;
    }
    return 0;
}
