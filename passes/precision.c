/* passes/precision.c: fp16 / bf16 mixed precision.
 *
 * Needs: the forward graph (it runs before autodiff, so the backward is born in the
 *        compute dtype).
 * Gives: for `precision` fp16 or bf16:
 *  - params stay fp32 (the master weights the optimizer updates); each forward use reads
 *    a compute copy made by one explicit cast per param, placed where its block's forward
 *    starts (outside blocks: before its first use), so the casts do not split the chains
 *    of elementwise ops that the fuse pass makes one kernel (a block's copies are live
 *    until its backward anyway);
 *  - float inputs and constants are cast likewise, so every forward op computes in the
 *    compute dtype (its kernel reduces and accumulates in fp32; cross-entropy's loss and
 *    attention's log-sum-exp stay fp32, as their shape rules say);
 *  - the gradient of a cast is a cast back, so params get fp32 gradients, applied in
 *    fp32; the shard pass reduces them over ranks in the compute dtype (reading the
 *    gradient before its cast back) unless `reduce_dtype fp32` asks for FairScale's
 *    fp32_reduce_scatter; with fsdp it also gathers params in the compute dtype;
 *  - fp16 only: a dynamic loss scale (initial 2^16) and a count of good steps, as state;
 *    autodiff seeds the backward with the scale, the optimizer pass unscales, skips a step
 *    whose gradients overflowed, and updates the scale (x0.5 on overflow, x2 after 2000
 *    good steps), like torch.cuda.amp.GradScaler.
 */
#include <string.h>

#include "passes.h"

enum { FP16_INITIAL_SCALE = 65536 };

typedef struct {
    Graph *g;
    DType to;
    int *cast_of;   // per value: its compute copy, or -1
    int *before;    // per new node: the original node it goes before
    int n_orig;
    int *block_start;  // per block: its first forward node
} Lowering;

/* The compute copy of f32 value v, made once, before node `at`, for `use` (whose
 * source location it takes). */
static int compute_copy(Lowering *p, int v, int use, int at)
{
    if (p->cast_of[v] >= 0) return p->cast_of[v];
    Graph *g = p->g;
    const Node *user = ir_node(g, use);
    Attr to = {.key = "to", .kind = ATTR_INT, .i = p->to};
    char err[256];
    int n = ir_node_add(g, OP_cast, &v, 1, &to, 1, user->block, PHASE_FORWARD, user->loc, err, sizeof err);
    FS_ASSERT(n >= 0);
    g->nodes[n].use = g->nodes[at].use;  // the application of a shared block it goes into
    p->before[n] = at;
    return p->cast_of[v] = ir_out(g, ir_node(g, n), 0);
}

static void lower_node(Lowering *p, int n)
{
    Graph *g = p->g;
    int b = g->nodes[n].block;
    for (int i = 0; i < g->nodes[n].n_in; i++) {
        int v = g->ids[g->nodes[n].in + i];
        if (g->values[v].dtype != DT_F32) continue;
        int param = g->values[v].role == ROLE_PARAM && b >= 0 && g->values[v].block == b;
        int c = compute_copy(p, v, n, param ? p->block_start[b] : n);
        g->ids[g->nodes[n].in + i] = c;
    }
    char err[256];
    int rc = ir_node_retype(g, n, err, sizeof err);
    if (rc) fprintf(stderr, "precision: node %d (%s): %s\n", n, op_name(g->nodes[n].op), err);
    FS_ASSERT(rc == 0);
}

/* The step's outputs (the loss, logits a user asked for) leave in fp32. */
static void outputs_in_fp32(Lowering *p)
{
    Graph *g = p->g;
    for (int i = 0; i < g->n_outputs; i++) {
        int v = g->outputs[i];
        if (g->values[v].dtype == DT_F32 || !dtype_is_float(g->values[v].dtype)) continue;
        const Value *val = ir_value(g, v);
        Attr to = {.key = "to", .kind = ATTR_INT, .i = DT_F32};
        char err[256];
        int n = ir_node_add(g, OP_cast, &v, 1, &to, 1, val->block, PHASE_FORWARD, val->loc, err, sizeof err);
        FS_ASSERT(n >= 0);
        p->before[n] = p->n_orig;  // after everything the forward made
        int out = ir_out(g, ir_node(g, n), 0);
        g->values[out].name = g->values[v].name;
        g->values[v].name = NULL;
        g->outputs[i] = out;
    }
}

static int state(Graph *g, const char *name, DType dt, InitKind init, double value)
{
    Value v = {.dtype = dt, .rank = 0, .role = ROLE_OPT_STATE, .block = -1, .producer = -1, .tied_to = -1,
               .init = init, .init_a = value, .name = name};
    return ir_value_add(g, &v);
}

int pass_precision(Graph *g, const Options *o, Diag *d)
{
    Lowering p = {g, precision_dtype(o->train.precision), NULL, NULL, g->n_nodes, NULL};
    ReduceDtype r = o->train.reduce_dtype;
    if ((r == REDUCE_FP16 && o->train.precision != PREC_FP16) || (r == REDUCE_BF16 && o->train.precision != PREC_BF16)) {
        diag_error(d, (Loc){0}, "reduce_dtype %s with precision %s: gradients are reduced in fp32 or in the compute "
                   "dtype; use reduce_dtype compute or fp32", reduce_name(r), precision_name(o->train.precision));
        return -1;
    }
    if (o->train.precision == PREC_FP32) return 0;
    int nv = g->n_values;
    p.cast_of = arena_alloc(g->arena, sizeof(int) * (size_t)nv + 1);
    p.before = arena_alloc(g->arena, sizeof(int) * ((size_t)g->n_nodes + (size_t)nv) + 1);
    memset(p.cast_of, -1, sizeof(int) * (size_t)nv);
    p.block_start = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_blocks + 1);
    for (int b = 0; b < g->n_blocks; b++) p.block_start[b] = p.n_orig;
    for (int n = p.n_orig - 1; n >= 0; n--)
        if (g->nodes[n].phase == PHASE_FORWARD && g->nodes[n].block >= 0) p.block_start[g->nodes[n].block] = n;
    for (int n = 0; n < p.n_orig; n++) {
        const Node *node = ir_node(g, n);
        if (node->phase == PHASE_FORWARD) lower_node(&p, n);
    }
    outputs_in_fp32(&p);
    int *order = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_nodes);
    int k = 0;
    for (int n = 0; n <= p.n_orig; n++) {
        for (int c = p.n_orig; c < g->n_nodes; c++)
            if (p.before[c] == n) order[k++] = c;
        if (n < p.n_orig) order[k++] = n;
    }
    FS_ASSERT(k == g->n_nodes);
    ir_nodes_reorder(g, order);
    if (o->train.precision == PREC_FP16) {
        g->loss_scale = state(g, "loss_scale", DT_F32, INIT_FULL, FP16_INITIAL_SCALE);
        g->values[g->loss_scale].step_role = SR_LOSS_SCALE;
        g->scale_good = state(g, "loss_scale.good_steps", DT_I32, INIT_ZEROS, 0);
    }
    return 0;
}
