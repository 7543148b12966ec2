/* passes/offload.c: the optimizer step, and what only it reads, in the host space
 * (ZeRO-Offload; FSDP's CPUOffload).
 *
 * Needs: the optimizer's update nodes (adamw, sgd), each on the fp32 storage it updates
 *        (a param, a unit's flat buffer, or this rank's shard of one: passes/shard.c).
 * Gives, for `offload optimizer`:
 *  - The storage each update writes is the fp32 master, on the host, and so is the
 *    update's state (AdamW's moments, SGD's momentum). A rank's shard of a full flat
 *    buffer (zero1, zero2) becomes a storage of its own there: the host holds the shard,
 *    never the whole.
 *  - The device keeps the params in the compute dtype only (16-bit under mixed
 *    precision, else fp32): once per step, before its first reader, the master is cast
 *    on the host and copied to the device (to_device) into a buffer of role gathered;
 *    with cast_in_update (mixed precision) and the delayed update the cast is the update's
 *    own: adamw_cast or sgd_cast writes the unit's 16-bit params on the host (role param16,
 *    kept between steps, made from the master at init and load), and the copy sends them;
 *    zero1 and zero2 copy into their rank's part of the full buffer, which their
 *    all-gather then fills in place, as before. The forward's casts of the params to the
 *    compute dtype are then identities, and go. So the device holds no fp32 master, and
 *    what crosses is 16-bit.
 *  - Each update's gradient goes to the host after its reduction (to_host), in its own
 *    dtype: a 16-bit gradient crosses in 16 bits and the host's update reads it as it
 *    is (the optimizer pass reads 16-bit gradients without a cast); the gradient norm's
 *    sums of squares read it on the device.
 *  - The learning rate, the clipping coefficient and the optimizer's step count, which
 *    stay on the device (the loss scale reads them there), cross as scalars.
 *  - `offload params` (fsdp only) keeps the param shards on the host as well: each of
 *    fsdp's gathers stages its own copy of the shard on the device just before it (the
 *    schedule pass moves the copy and its cast along when it prefetches the gather).
 *  - `delayed_update 1` (ZeRO-Offload's delayed parameter update): the host runs step
 *    t's update during step t+1, whose forward and backward then read the params update
 *    t-1 made. What the update reads of step t, its gradient and the three scalars,
 *    waits a step on the host in state of its own (role optimizer state, so checkpoints
 *    hold it): each update's `<target>.pending_grad` and `pending.lr`, `pending.coef`,
 *    `pending.opt_step`, which the step's copies to the host write (views of them), after
 *    the step's update has read them. The coefficient starts as NaN, the skipped step's
 *    mark (clip_coef's under an fp16 overflow), so step 1 updates nothing. Each update
 *    goes just after the last node that reads its master for the device (its cast and
 *    copy: so the step computes on the master before the update), with nothing of the
 *    step's backward to wait for: the schedule pass leaves it there.
 * Every copy is a node (to_host, to_device: OPF_COPY), which the schedule pass puts on
 * the copy stream; no op but a copy reads or writes both spaces. Arithmetic is unchanged:
 * the same kernels on the same values, so an offloaded run equals the run without
 * (delayed_update: the run whose step t reads the params of update t-2).
 */
#include <math.h>
#include <string.h>

#include "passes.h"

/* Where a new node goes: before original node `at` (n_orig: at the end). */
typedef struct {
    int node, at;
} Placed;

typedef struct {
    Graph *g;
    const TrainConfig *t;
    DType low;          // the compute dtype
    int n_orig;         // nodes before this pass
    Placed *placed;
    int n_placed, cap_placed;
    char *drop;         // per node: removed at the end (an identity cast)
    int work16;         // cast_in_update: the host's update writes the 16-bit params the device gets
    char *replaced;     // per original node: an update that update_writing replaced
} Off;

static int add_node(Off *o, OpKind op, const int *in, int n_in, const Attr *attrs, int n_attr, int block, Phase ph,
                    Loc loc, int at)
{
    char err[256];
    int n = ir_node_add(o->g, op, in, n_in, attrs, n_attr, block, ph, loc, err, sizeof err);
    if (n < 0) fprintf(stderr, "offload: %s\n", err);
    FS_ASSERT(n >= 0);
    o->placed = arena_grow(o->g->arena, o->placed, &o->cap_placed, o->n_placed + 1, sizeof *o->placed);
    o->placed[o->n_placed++] = (Placed){n, at};
    return ir_node(o->g, n)->n_out ? ir_out(o->g, ir_node(o->g, n), 0) : -1;
}

static int copy_to(Off *o, OpKind op, int x, int at)
{
    const Value *v = ir_value(o->g, x);
    int y = add_node(o, op, &x, 1, NULL, 0, v->block, PHASE_COMM, v->loc, at);
    o->g->values[y].place = op == OP_to_host ? PLACE_HOST : PLACE_DEVICE;
    return y;
}

static int cast_on_host(Off *o, int x, DType to, int at)
{
    const Value *v = ir_value(o->g, x);
    Attr a = {.key = "to", .kind = ATTR_INT, .i = to};
    int y = add_node(o, OP_cast, &x, 1, &a, 1, v->block, PHASE_COMM, v->loc, at);
    o->g->values[y].place = PLACE_HOST;
    const char *name = ir_value(o->g, x)->name;
    if (name) o->g->values[y].name = arena_printf(o->g->arena, "%s.%s", name, dtype_name(to));
    return y;
}

/* The first original node that reads value v or a view inside it, except node `skip`;
 * n_orig if none. */
static int first_reader(const Off *o, int v, int skip)
{
    const Graph *g = o->g;
    for (int n = 0; n < o->n_orig; n++) {
        const Node *node = ir_node(g, n);
        if (n == skip) continue;
        for (int i = 0; i < node->n_in; i++)
            for (int x = ir_in(g, node, i), hops = 0; x >= 0 && hops < 64; x = ir_view_parent(g, x), hops++)
                if (x == v) return n;
    }
    return o->n_orig;
}

/* The node after which value v's bytes are all written: the last node writing v or a
 * view inside it (an in-place reduction's output is a view of the flat gradient; without
 * one, under shard none, the backward writes the params' gradients into the flat buffer
 * its zeroing made). */
static int writer_of(const Graph *g, int v)
{
    int last = -1;
    for (int n = 0; n < g->n_nodes; n++)
        for (int i = 0; i < ir_node(g, n)->n_out; i++)
            for (int x = ir_out(g, ir_node(g, n), i), hops = 0; x >= 0 && hops < 64; x = g->values[x].view_of, hops++)
                if (x == v) last = n;
    return last;
}

static void replace_input(Graph *g, int node, int from, int to)
{
    Node *n = &g->nodes[node];
    for (int i = 0; i < n->n_in; i++)
        if (g->ids[n->in + i] == from) g->ids[n->in + i] = to;
}

/* Value v (and the views inside it, transitively) now holds dtype `to`: views' byte
 * offsets scale with the element size. */
static void retype_tree(Graph *g, int v, DType to)
{
    Value *x = &g->values[v];
    if (x->dtype == to) return;
    int from = dtype_size(x->dtype), es = dtype_size(to);
    x->dtype = to;
    x->view_offset = x->view_offset / from * es;
    x->view_rank_stride = x->view_rank_stride / from * es;
    for (int w = 0; w < g->n_values; w++)
        if (g->values[w].view_of == v) retype_tree(g, w, to);
}

/* ---- the gradient ---------------------------------------------------------------------- */

/* The update's gradient g, on the host: a copy there, of role grad (it is the gradient
 * the host's update reads), in g's dtype (a 16-bit gradient crosses in 16 bits and the
 * update reads it as it is). */
static int grad_to_host(Off *o, int g_, int update)
{
    Graph *g = o->g;
    int after = writer_of(g, g_);
    int h = copy_to(o, OP_to_host, g_, after >= 0 ? after + 1 : update);
    const Value *v = ir_value(g, g_);
    g->values[h].role = ROLE_GRAD;
    g->values[h].sharded = v->sharded, g->values[h].unit = v->unit;
    if (v->name) g->values[h].name = arena_printf(g->arena, "%s.host", v->name);
    return h;
}

/* ---- the delayed update's pending state -------------------------------------------------- */

/* A persistent host tensor like value x (its dtype and shape), of role optimizer state:
 * what a delayed update reads of the step before. */
static int pending_like(Off *o, int x, const char *name, InitKind init, double init_a)
{
    Graph *g = o->g;
    const Value *xv = ir_value(g, x);
    Value s = {.dtype = xv->dtype, .rank = xv->rank, .role = ROLE_OPT_STATE, .block = xv->block,
               .place = PLACE_HOST, .name = name, .loc = xv->loc, .producer = -1, .init = init, .init_a = init_a,
               .tied_to = -1, .grad = -1};
    memcpy(s.shape, xv->shape, sizeof s.shape);
    int v = ir_value_add(g, &s);
    g->values[v].unit = xv->unit, g->values[v].sharded = xv->sharded;
    return v;
}

/* Value x copied to the host into the bytes of pending tensor `into` (a view of it),
 * before original node `at`. */
static void copy_into(Off *o, int x, int into, int at)
{
    int y = copy_to(o, OP_to_host, x, at);
    Value *yv = &o->g->values[y];
    yv->view_of = into, yv->view_offset = yv->view_rank_stride = 0;
}

/* A scalar the updates read (`which`: 0 the lr, 1 the coefficient, 2 the step count, as
 * the updates take them): its step's value waits on the host for the next step's
 * updates. The coefficient starts as NaN: no update pending before step 1. */
static int pending_scalar(Off *o, int x, int which, int at)
{
    static const char *const names[3] = {"pending.lr", "pending.coef", "pending.opt_step"};
    int p = pending_like(o, x, names[which], which == 1 ? INIT_FULL : INIT_ZEROS, which == 1 ? NAN : 0);
    copy_into(o, x, p, at);
    return p;
}

/* The copy gh of an update's gradient (update target p) writes its pending gradient
 * instead, which the update reads. */
static int pending_grad(Off *o, int gh, int p)
{
    Graph *g = o->g;
    const Value *pv = ir_value(g, p);
    const char *name = pv->name;  // as the optimizer pass names the state (a shard's: after its buffer)
    if (!name && pv->view_of >= 0 && ir_value(g, pv->view_of)->name)
        name = arena_printf(g->arena, "%s.shard", ir_value(g, pv->view_of)->name);
    int pg = pending_like(o, gh, arena_printf(g->arena, "%s.pending_grad", name ? name : "state"), INIT_ZEROS, 0);
    Value *hv = &g->values[gh];
    hv->view_of = pg, hv->view_offset = hv->view_rank_stride = 0;
    return pg;
}

/* ---- the params ------------------------------------------------------------------------ */

/* Where a copy to the device lands: a view of `of` (bytes at offset, plus stride per
 * rank), or (of < 0) a buffer of its own. */
typedef struct {
    int of;
    int64_t offset, stride;
} Into;

/* cast_in_update: update n (adamw, sgd, on the host) becomes the same update writing w,
 * the 16-bit params of its master kept on the host between steps (adamw_cast,
 * sgd_cast), in its place; w. */
static int update_writing(Off *o, int n)
{
    Graph *g = o->g;
    const Node *node = ir_node(g, n);
    const Value *pv = ir_value(g, ir_in(g, node, 0));
    Value wv = {.dtype = o->low, .rank = 1, .shape = {ir_numel(pv)}, .role = ROLE_PARAM16, .block = pv->block,
                .place = PLACE_HOST, .loc = pv->loc, .producer = -1, .tied_to = -1};
    wv.name = pv->name ? arena_printf(g->arena, "%s.%s", pv->name, dtype_name(o->low)) : NULL;
    int w = ir_value_add(g, &wv);
    g->values[w].unit = pv->unit, g->values[w].sharded = pv->sharded;
    int in[OPS_MAX_IN], n_in = node->n_in;
    for (int i = 0; i < n_in; i++) in[i] = ir_in(g, node, i);
    in[n_in] = w;
    Attr at[IR_MAX_PARAMS];
    int n_attr = ir_node_attrs(g, node, at);
    OpKind op = node->op == OP_adamw ? OP_adamw_cast : OP_sgd_cast;
    add_node(o, op, in, n_in + 1, at, n_attr, node->block, node->phase, node->loc, n);
    o->replaced[n] = 1;
    return w;
}

/* The master p (on the host) as the device reads it: cast to the compute dtype on the
 * host (or, w >= 0, the 16-bit params its update writes there), then copied, before
 * original node `at`, into `into` or (into.of < 0) a new buffer of role gathered. */
static int master_to_device(Off *o, int p, int w, int at, Into into)
{
    Graph *g = o->g;
    int x = w >= 0 ? w : o->low != DT_F32 ? cast_on_host(o, p, o->low, at) : p;
    int d = copy_to(o, OP_to_device, x, at);
    Value *dv = &g->values[d];
    const Value *pv = ir_value(g, p);
    dv->role = ROLE_GATHERED;
    dv->unit = pv->unit;
    dv->sharded = pv->sharded;
    if (into.of >= 0) {
        dv->view_of = into.of, dv->view_offset = into.offset, dv->view_rank_stride = into.stride;
    } else {
        dv->name = pv->name ? arena_printf(g->arena, "%s.device", pv->name) : NULL;
    }
    return d;
}

/* Every device node but `update` that reads p itself reads d instead, and every view
 * inside p lies in d: in the compute dtype. */
static void device_reads(Off *o, int p, int d, int update)
{
    Graph *g = o->g;
    for (int n = 0; n < o->n_orig; n++)
        if (n != update) replace_input(g, n, p, d);
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].view_of == p && v != d) {
            g->values[v].view_of = d;
            retype_tree(g, v, g->values[d].dtype);
        }
}

/* A master that is a storage of its own (shard none, ddp, fsdp): it moves to the host,
 * and the device reads a copy made once a step (fsdp with offload params: one per
 * reader, each gather's staged shard), of w when the update writes 16-bit params. */
static void own_master(Off *o, int p, int w, int update)
{
    Graph *g = o->g;
    g->values[p].place = PLACE_HOST;
    int per_reader = o->t->offload == OFFLOAD_PARAMS;
    if (!per_reader) {
        int at = first_reader(o, p, update);
        if (at == o->n_orig) return;  // nothing on the device reads it
        device_reads(o, p, master_to_device(o, p, w, at, (Into){-1, 0, 0}), update);
        return;
    }
    for (int n = 0; n < o->n_orig; n++) {
        const Node *node = ir_node(g, n);
        int reads = 0;
        for (int i = 0; i < node->n_in; i++) reads |= ir_in(g, node, i) == p;
        if (!reads || n == update) continue;
        int d = master_to_device(o, p, w, n, (Into){-1, 0, 0});
        g->values[d].role = ROLE_COMM;  // a staging buffer the gather reads, not the device's params
        replace_input(g, n, p, d);
    }
}

/* A master that is this rank's shard of a full flat buffer (zero1, zero2): the shard
 * becomes a storage of its own on the host; the full buffer stays on the device, in the
 * compute dtype, no longer persistent (role gathered): the copy fills this rank's part
 * and the all-gather the rest, where the shard pass put it. */
static void shard_master(Off *o, int p, int update)
{
    Graph *g = o->g;
    Value *pv = &g->values[p];
    int full = pv->view_of, es = dtype_size(pv->dtype), low = dtype_size(o->low);
    const Value *fv = ir_value(g, full);
    FS_ASSERT(fv->view_of < 0 && fv->producer < 0);
    Into into = {full, pv->view_offset / es * low, pv->view_rank_stride / es * low};
    pv->flat_offset = fv->flat_offset + pv->view_offset / es;
    pv->view_of = -1;
    pv->view_offset = pv->view_rank_stride = 0;
    pv->place = PLACE_HOST;
    pv->unit = fv->unit;
    pv->name = arena_printf(g->arena, "%s.shard", fv->name ? fv->name : "flat_param");
    g->values[full].role = ROLE_GATHERED;
    retype_tree(g, full, o->low);
    for (int n = 0; n < o->n_orig; n++) {  // the all-gather that fills the buffer from the part
        const Node *node = ir_node(g, n);
        int reads = 0;
        for (int i = 0; i < node->n_in; i++) reads |= ir_in(g, node, i) == p;
        if (reads && n != update) replace_input(g, n, p, master_to_device(o, p, -1, n, into));
    }
}

/* ---- identity casts --------------------------------------------------------------------- */

/* Casts whose input is now of their target dtype (the device's params already in the
 * compute dtype) go: their readers read the input. Then every node reading a retyped
 * view (a reshape of a param) is retyped in order. */
static void drop_identity_casts(Off *o)
{
    Graph *g = o->g;
    int *same = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_values + 1);
    o->drop = arena_alloc(g->arena, (size_t)g->n_nodes + 1);  // every node is made by now
    memcpy(o->drop, o->replaced, (size_t)o->n_orig);  // the updates that update_writing replaced
    for (int v = 0; v < g->n_values; v++) same[v] = v;
    for (int n = 0; n < g->n_nodes; n++) {
        Node *node = &g->nodes[n];
        for (int i = 0; i < node->n_in; i++) g->ids[node->in + i] = same[g->ids[node->in + i]];
        if (node->op == OP_cast) {
            int x = ir_in(g, node, 0);
            if (ir_value(g, x)->dtype == (DType)ir_attr_int(g, node, "to", -1) && ir_value(g, x)->place ==
                ir_value(g, ir_out(g, node, 0))->place) {
                same[ir_out(g, node, 0)] = x;
                o->drop[n] = 1;
                continue;
            }
        }
        if (op_info(node->op)->flags & OPF_VIEW) {
            char err[256];
            int rc = ir_node_retype(g, n, err, sizeof err);
            if (rc) fprintf(stderr, "offload: %s\n", err);
            FS_ASSERT(rc == 0);
        }
    }
    for (int i = 0; i < g->n_outputs; i++) g->outputs[i] = same[g->outputs[i]];
}

/* ---- order -------------------------------------------------------------------------------- */

static void place_nodes(Off *o)
{
    Graph *g = o->g;
    int nn = g->n_nodes, n = 0, k = 0;
    int *order = arena_alloc(g->arena, sizeof(int) * (size_t)nn + 1);
    /* Placed nodes before their original node, in the order they were made (a node is
     * made after the nodes it reads): a stable counting sort by that node. */
    int *start = arena_alloc(g->arena, sizeof(int) * (size_t)(o->n_orig + 2));
    int *by_at = arena_alloc(g->arena, sizeof(int) * (size_t)o->n_placed + 1);
    for (int i = 0; i < o->n_placed; i++) start[o->placed[i].at + 1]++;
    for (int i = 0; i <= o->n_orig; i++) start[i + 1] += start[i];
    for (int i = 0; i < o->n_placed; i++) by_at[start[o->placed[i].at]++] = o->placed[i].node;
    for (int i = 0; i <= o->n_orig; i++) {  // start[i]: the placed nodes due at or before node i
        while (k < start[i]) order[n++] = by_at[k++];
        if (i < o->n_orig) order[n++] = i;
    }
    FS_ASSERT(n == nn);
    ir_nodes_reorder(g, order);
    char *drop = arena_alloc(g->arena, (size_t)nn + 1);
    for (int i = 0; i < nn; i++) drop[i] = o->drop[order[i]];
    ir_graph_compact(g, drop);
}

/* delayed_update: each update goes just after the last other node that reads its master
 * (or a view in it, its cast on the host, or the 16-bit params an adamw_cast writes there): the cast and copy that give the device this
 * step's params, which the update must not change before they have read them (after
 * the copy, not between: on a GPU the host's update would hold the copy back). Nothing
 * else it reads is made in the step: its pending state is written after it, by the
 * copies to the host. */
static void delay_updates(Graph *g)
{
    int nn = g->n_nodes, n = 0;
    int *after = arena_alloc(g->arena, sizeof(int) * (size_t)nn + 1);  // per update: the node it follows, or -1
    int *order = arena_alloc(g->arena, sizeof(int) * (size_t)nn + 1);
    char *of_p = arena_alloc(g->arena, (size_t)g->n_values + 1);  // the master, and its casts on the host
    for (int u = 0; u < nn; u++) {
        const Node *un = ir_node(g, u);
        after[u] = -2;  // not an update
        if (!ops_is_update(un->op)) continue;
        memset(of_p, 0, (size_t)g->n_values);
        of_p[ir_in(g, un, 0)] = 1;
        int at16 = ops_update_copy_input(un->op);
        if (at16 >= 0) of_p[ir_in(g, un, at16)] = 1;  // its 16-bit w
        after[u] = -1;
        for (int k = 0; k < u; k++) {
            const Node *kn = ir_node(g, k);
            if (ops_is_update(kn->op)) continue;
            int reads = 0;
            for (int i = 0; i < kn->n_in; i++)
                for (int x = ir_in(g, kn, i), hops = 0; x >= 0 && hops < 64; x = ir_view_parent(g, x), hops++)
                    reads |= of_p[x];
            if (!reads) continue;
            after[u] = k;
            if (kn->op == OP_cast && ir_value(g, ir_out(g, kn, 0))->place == PLACE_HOST) of_p[ir_out(g, kn, 0)] = 1;
        }
        for (int k = 0; k <= after[u]; k++) {  // what it reads is of the step before: nothing before it writes it
            const Node *kn = ir_node(g, k);
            for (int j = 0; j < kn->n_out; j++)
                for (int x = ir_out(g, kn, j), hops = 0; x >= 0 && hops < 64; x = ir_view_parent(g, x), hops++)
                    for (int i = 0; i < un->n_in; i++) FS_ASSERT(ir_in(g, un, i) != x);
        }
    }
    for (int u = 0; u < nn; u++)
        if (after[u] == -1) order[n++] = u;
    for (int k = 0; k < nn; k++) {
        if (after[k] != -2) continue;
        order[n++] = k;
        for (int u = k + 1; u < nn; u++)
            if (after[u] == k) order[n++] = u;
    }
    FS_ASSERT(n == nn);
    ir_nodes_reorder(g, order);
}

int pass_offload(Graph *g, const Options *opts, Diag *d)
{
    (void)d;
    const TrainConfig *t = &opts->train;
    if (t->offload == OFFLOAD_NONE) return 0;
    Off o = {.g = g, .t = t, .low = precision_dtype(t->precision), .n_orig = g->n_nodes};
    /* cast_in_update only with the delayed update. Without it the host's update runs during the backward, after the
     * copy that sends its w to the device, which it must wait for: that keeps the copy's device buffer live through
     * the backward (one 16-bit shard more at the peak: +0.36 GiB a rank at GPT-2 1.5B, zero2 over 8). The host's
     * own cast costs the device nothing, so plain offload keeps it. */
    o.work16 = o.low != DT_F32 && t->cast_in_update && t->delayed_update;
    o.replaced = arena_alloc(g->arena, (size_t)o.n_orig + 1);
    memset(o.replaced, 0, (size_t)o.n_orig + 1);
    int first = -1;
    for (int n = 0; n < o.n_orig && first < 0; n++)
        if (g->nodes[n].op == OP_adamw || g->nodes[n].op == OP_sgd) first = n;
    if (first < 0) return 0;  // nothing to update
    /* The scalars every update reads (lr, coefficient, step count): once each, to the host. */
    int *scalar_h = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_values + 1);
    memset(scalar_h, -1, sizeof(int) * (size_t)g->n_values);
    for (int n = first; n < o.n_orig; n++) {
        OpKind op = g->nodes[n].op;
        if (op != OP_adamw && op != OP_sgd) continue;
        int adam = op == OP_adamw, n_state = adam ? 2 : 1, n_in = g->nodes[n].n_in;
        int p = ir_in(g, ir_node(g, n), 0), grad = ir_in(g, ir_node(g, n), 1);
        for (int i = 2 + n_state; i < n_in; i++) {  // (copy_to may move g->ids: no pointer into it held)
            int x = ir_in(g, ir_node(g, n), i);
            if (scalar_h[x] < 0)
                scalar_h[x] = t->delayed_update ? pending_scalar(&o, x, i - 2 - n_state, first)
                                                : copy_to(&o, OP_to_host, x, first);
            g->ids[g->nodes[n].in + i] = scalar_h[x];
        }
        for (int i = 2; i < 2 + n_state; i++) {  // the state (SGD without momentum: the gradient)
            int s = ir_in(g, ir_node(g, n), i);
            if (s != grad) g->values[s].place = PLACE_HOST;
        }
        int gh = grad_to_host(&o, grad, n);
        if (t->delayed_update) gh = pending_grad(&o, gh, p);
        for (int i = 1; i < 2 + n_state; i++)
            if (g->ids[g->nodes[n].in + i] == grad) g->ids[g->nodes[n].in + i] = gh;
        if (ir_value(g, p)->view_of >= 0)  // (fp32 only: 16-bit zero1 and zero2 store the fp32 shard on its own)
            shard_master(&o, p, n);
        else
            own_master(&o, p, o.work16 ? update_writing(&o, n) : -1, n);
    }
    drop_identity_casts(&o);
    place_nodes(&o);
    if (t->delayed_update) delay_updates(g);
    return 0;
}
