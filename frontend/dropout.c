/* frontend/dropout.c: lowering dropout(x, p).
 *
 * Source passes x and p (a constant in [0, 1)); the node gets what makes its mask a pure
 * function of (seed, step, op, element), whatever the strategy (runtime/cpu/dropout.c):
 *   rng    the step's RNG words, one i32 [4] input of the graph (step role SR_RNG) that
 *          the runtime writes: seed, step, this rank's data-parallel index
 *   key    the op's number in the model, in lowering order (each layer instance's own);
 *          recompute and micro-batch copies keep it, so they draw the same mask
 *   batch  x's first dim is the batch (a part of the global batch's rows: it has the batch
 *          dim's size and x depends on a batched input), so its elements are counted in
 *          the global batch; else every rank's x is the whole tensor
 *   mb, mbs  the micro-batch (passes/pipeline.c sets mb on each copy) of mbs per rank
 * p = 0 is the identity and makes no node. In evaluation every dropout is the identity:
 * passes_eval_identity (passes/eval.c) takes the nodes out of an evaluation program.
 */
#include <string.h>

#include "lower.h"

/* The graph's rng input, made on first use. */
static int rng_input(Lower *L)
{
    if (L->rng >= 0) return L->rng;
    Value v = {.dtype = DT_I32, .rank = 1, .shape = {4}, .role = ROLE_INPUT, .block = -1, .name = "rng",
               .producer = -1, .tied_to = -1, .grad = -1};
    L->rng = ir_value_add(L->g, &v);
    L->g->values[L->rng].step_role = SR_RNG;
    return L->rng;
}

/* Whether value x depends on a batched input (the model's inputs: their first dim is the
 * batch). */
static int from_batch(Lower *L, int x)
{
    Graph *g = L->g;
    char *seen = arena_alloc(L->tmp, (size_t)g->n_values + 1);
    int *stack = arena_alloc(L->tmp, sizeof *stack * ((size_t)g->n_values + 1)), n = 0;
    memset(seen, 0, (size_t)g->n_values + 1);
    stack[n++] = x, seen[x] = 1;
    while (n > 0) {
        const Value *v = ir_value(g, stack[--n]);
        if (v->role == ROLE_INPUT && v->step_role == SR_NONE && v->rank > 0) return 1;
        if (v->producer < 0) continue;
        const Node *nd = ir_node(g, v->producer);
        for (int i = 0; i < nd->n_in; i++) {
            int u = ir_in(g, nd, i);
            if (!seen[u]) seen[u] = 1, stack[n++] = u;
        }
    }
    return 0;
}

static int batch_leading(Lower *L, int x)
{
    if (!L->batch_dim) return 0;
    const Binding *b = scope_find(&L->model, L->batch_dim);
    const Value *v = ir_value(L->g, x);
    return b && b->kind == B_DIM && v->rank > 0 && v->shape[0] == b->dim && from_batch(L, x);
}

RVal lower_dropout(Lower *L, Scope *s, const Expr *e)
{
    const RVal poison = {.kind = RV_POISON, .id = -1};
    const OpInfo *info = op_info(OP_dropout);
    OpInfo user = *info;  // what source binds: x and p; the other parameters are the compiler's
    user.sig = "x, p:float";
    user.params[1] = info->params[op_param_index(info, "p")];
    user.n_params = 2, user.n_tensors = 1;
    const Expr *slot[IR_MAX_PARAMS] = {0};
    int n_xs = 0;
    if (lower_bind_args(L, e, &user, slot, NULL, &n_xs)) return poison;
    int x = lower_tensor_arg(L, s, &user, "x", slot[0]);
    double p = 0;
    if (ce_float(L, s, slot[1], "dropout: argument 'p'", &p) || x < 0) return poison;
    if (!(p >= 0 && p < 1)) {
        diag_error(L->d, slot[1]->loc, "dropout: p must be in [0, 1), got %g", p);
        return poison;
    }
    if (p == 0) return (RVal){.kind = RV_VALUE, .id = x};
    int in[2] = {x, rng_input(L)};
    Attr a[5] = {{.key = "p", .kind = ATTR_FLOAT, .f = p},
                 {.key = "key", .kind = ATTR_INT, .i = L->n_dropouts++},
                 {.key = "batch", .kind = ATTR_INT, .i = batch_leading(L, x)},
                 {.key = "mb", .kind = ATTR_INT, .i = 0},
                 {.key = "mbs", .kind = ATTR_INT, .i = L->batch_dim && L->microbatches > 1 ? L->microbatches : 1}};
    return lower_add_node(L, OP_dropout, in, 2, a, 5, e->loc);
}
