/* frontend/expr.c: assignments and expressions, to IR nodes.
 *
 * An expression lowers to an RVal: a value id; a number not yet made a tensor (so that
 * `2 * 3` or `C / NH` folds into one `scalar` node); a tuple (split, a layer with several
 * returns), which only an assignment may take apart; or poison, the result of anything
 * that already reported an error, which every consumer passes on silently.
 *
 * Op calls bind their arguments to the op's signature from ops.def (tensors first, then
 * attributes by position or keyword, bare flag names), and store every attribute on the
 * node, defaults included but for an ignore_index of none (dropout binds x and p and adds
 * what the compiler owns: its RNG input and key, below). Layer calls are instance.c's,
 * indexing index.c's.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lower.h"

static RVal poison(void) { return (RVal){.kind = RV_POISON, .id = -1}; }
static RVal value(int id) { return (RVal){.kind = RV_VALUE, .id = id}; }
static RVal constant(double c) { return (RVal){.kind = RV_CONST, .id = -1, .c = c}; }

RVal lower_tuple(Lower *L, const int *ids, int n, const char *what)
{
    RVal r = {.kind = RV_TUPLE, .id = -1, .n = n, .what = what};
    r.ids = arena_alloc(L->tmp, sizeof(int) * (size_t)(n > 0 ? n : 1));
    memcpy(r.ids, ids, sizeof(int) * (size_t)n);
    return r;
}

/* An op's message may already start with its name ("matmul: inner dims differ"). */
static void node_error(Lower *L, OpKind op, Loc loc, const char *err)
{
    const char *name = op_name(op);
    size_t n = strlen(name);
    if (strncmp(err, name, n) == 0 && err[n] == ':')
        diag_error(L->d, loc, "%s", err);
    else
        diag_error(L->d, loc, "%s: %s", name, err[0] ? err : "invalid arguments");
}

int lower_too_big(Lower *L, Loc loc)
{
    if (L->g->n_nodes + L->g->n_values < LOWER_MAX_ITEMS) return 0;
    if (!L->big_reported)
        diag_error(L->d, loc, "the model has more than %d nodes and values; make it smaller",
                   LOWER_MAX_ITEMS);
    L->big_reported = 1;
    return 1;
}

static RVal add_node(Lower *L, OpKind op, const int *in, int n_in, const Attr *attrs,
                     int n_attr, Loc loc)
{
    char err[512] = "";
    if (lower_too_big(L, loc)) return poison();
    int id = ir_node_add(L->g, op, in, n_in, attrs, n_attr, L->block, PHASE_FORWARD, loc, err,
                         sizeof err);
    if (id < 0) {
        node_error(L, op, loc, err);
        return poison();
    }
    L->g->nodes[id].use = L->use;
    const Node *nd = ir_node(L->g, id);
    int outs[IR_MAX_OUT];
    for (int i = 0; i < nd->n_out; i++) {
        const Value *v = ir_value(L->g, ir_out(L->g, nd, i));
        if (ce_numel(v) < 0) {
            char buf[256];
            diag_error(L->d, loc, "%s: its result %s has more than 2^48 elements", op_name(op),
                       ir_type_str(v, buf, sizeof buf));
            return poison();
        }
        outs[i] = ir_out(L->g, nd, i);
    }
    /* An op's saved state (attention's log-sum-exp) is for backward, not for source. */
    if (nd->n_out == 1 || (op_info(op)->flags & OPF_SAVES)) return value(outs[0]);
    return lower_tuple(L, outs, nd->n_out, op_name(op));
}

static int scalar_of(Lower *L, double c, Loc loc)
{
    Attr a = {.key = "value", .kind = ATTR_FLOAT, .f = c};
    RVal r = add_node(L, OP_scalar, NULL, 0, &a, 1, loc);
    return r.kind == RV_VALUE ? r.id : -1;
}

/* The one tensor `r` stands for, or -1 (after an error when it is a tuple). */
static int one_value(Lower *L, RVal r, Loc loc)
{
    switch (r.kind) {
    case RV_VALUE: return r.id;
    case RV_CONST: return scalar_of(L, r.c, loc);
    case RV_TUPLE:
        diag_error(L->d, loc, "%s gives %d values where one is expected; assign them to %d names first",
                   r.what, r.n, r.n);
        return -1;
    default: return -1;
    }
}

RVal lower_add_node(Lower *L, OpKind op, const int *in, int n_in, const Attr *attrs, int n_attr, Loc loc)
{
    return add_node(L, op, in, n_in, attrs, n_attr, loc);
}

int lower_one_value(Lower *L, RVal r, Loc loc) { return one_value(L, r, loc); }

static RVal lower_name(Lower *L, Scope *s, const Expr *e)
{
    const Binding *b = scope_find(s, e->name);
    if (!b) {
        lower_unknown(L, s, e->name, e->loc, 0);
        return poison();
    }
    if (b->poisoned) return poison();
    if (b->kind == B_DIM) return constant((double)b->dim);
    return value(b->value);
}

static RVal lower_neg(Lower *L, Scope *s, const Expr *e)
{
    RVal r = lower_expr(L, s, e->lhs);
    if (r.kind == RV_CONST) return constant(-r.c);
    int x = one_value(L, r, e->lhs->loc);
    return x < 0 ? poison() : add_node(L, OP_neg, &x, 1, NULL, 0, e->loc);
}

/* x ** p: p must be a constant (a number, a dim expression); a constant base folds. */
static RVal lower_pow(Lower *L, const Expr *e, RVal a, RVal b)
{
    if (a.kind == RV_POISON || b.kind == RV_POISON) return poison();
    if (b.kind != RV_CONST) {
        diag_error(L->d, e->rhs->loc, "'**' takes a constant exponent (a number or a dim expression), not a tensor");
        return poison();
    }
    if (a.kind == RV_CONST) {
        double c = pow(a.c, b.c);
        if (isnan(c)) diag_error(L->d, e->loc, "the constant (%g) ** %g is not a real number", a.c, b.c);
        else if (!isfinite(c)) diag_error(L->d, e->loc, "the constant %g ** %g is too large", a.c, b.c);
        return isfinite(c) ? constant(c) : poison();
    }
    int x = one_value(L, a, e->lhs->loc);
    Attr p = {.key = "p", .kind = ATTR_FLOAT, .f = b.c};
    return x < 0 ? poison() : add_node(L, OP_pow, &x, 1, &p, 1, e->loc);
}

static RVal lower_binary(Lower *L, Scope *s, const Expr *e)
{
    RVal a = lower_expr(L, s, e->lhs), b = lower_expr(L, s, e->rhs);
    if (e->op == '^') return lower_pow(L, e, a, b);
    if (a.kind == RV_CONST && b.kind == RV_CONST && e->op != '@') {
        double c = 0;
        switch (e->op) {
        case '+': c = a.c + b.c; break;
        case '-': c = a.c - b.c; break;
        case '*': c = a.c * b.c; break;
        case '/':
            if (b.c == 0) {
                diag_error(L->d, e->loc, "division by zero");
                return poison();
            }
            c = a.c / b.c;
            break;
        }
        if (!isfinite(c)) {
            diag_error(L->d, e->loc, "the constant %g %c %g is too large", a.c, e->op, b.c);
            return poison();
        }
        return constant(c);
    }
    int x = one_value(L, a, e->lhs->loc), y = one_value(L, b, e->rhs->loc);
    if (x < 0 || y < 0) return poison();
    OpKind op = e->op == '+' ? OP_add : e->op == '-' ? OP_sub : e->op == '*' ? OP_mul
              : e->op == '/' ? OP_div : OP_matmul;
    int in[2] = {x, y};
    return add_node(L, op, in, 2, NULL, 0, e->loc);
}

/* ---- op calls ------------------------------------------------------------------------ */

static int param_index(const OpInfo *info, const char *name)
{
    for (int k = 0; k < info->n_params; k++)
        if (strcmp(info->params[k].name, name) == 0) return k;
    return -1;
}

static int is_flag_name(const OpInfo *info, const Expr *e)
{
    if (e->kind != EX_NAME) return -1;
    int k = param_index(info, e->name);
    return k >= 0 && info->params[k].kind == ARG_FLAG ? k : -1;
}

/* In concat(x, y, -1), the trailing numbers and lists are attributes, not tensors. */
static int attr_like(const Expr *e)
{
    return e->kind == EX_NUM || e->kind == EX_LIST || (e->kind == EX_NEG && e->lhs->kind == EX_NUM);
}

static int any_default(const OpInfo *info)
{
    for (int k = 0; k < info->n_params; k++)
        if (info->params[k].has_default) return 1;
    return 0;
}

static void too_many(Lower *L, const Expr *e, const OpInfo *info, int got)
{
    if (info->n_tensors < 0)
        diag_error(L->d, e->loc, "%s: expects its tensors and at most %d more argument%s, got %d",
                   info->name, info->n_params - 1, info->n_params == 2 ? "" : "s", got);
    else if (any_default(info))
        diag_error(L->d, e->loc, "%s: expects at most %d argument%s, got %d", info->name,
                   info->n_params, info->n_params == 1 ? "" : "s", got);
    else
        diag_error(L->d, e->loc, "%s: expects %d argument%s, got %d", info->name, info->n_params,
                   info->n_params == 1 ? "" : "s", got);
}

static int bind_keyword(Lower *L, const OpInfo *info, const Arg *a, const Expr **slot)
{
    int k = param_index(info, a->key);
    if (k < 0) {
        const char *names[IR_MAX_PARAMS];
        for (int i = 0; i < info->n_params; i++) names[i] = info->params[i].name;
        const char *best = diag_closest(a->key, names, info->n_params);
        if (best)
            diag_error(L->d, a->key_loc, "%s: no parameter named '%s'; did you mean '%s'?",
                       info->name, a->key, best);
        else
            diag_error(L->d, a->key_loc, "%s: no parameter named '%s' (its signature is %s(%s))",
                       info->name, a->key, info->name, info->sig);
        return -1;
    }
    if (info->params[k].kind == ARG_TENSORS) {
        diag_error(L->d, a->key_loc, "%s: its tensors are passed by position, not as '%s ='",
                   info->name, a->key);
        return -1;
    }
    if (slot[k]) {
        diag_error(L->d, a->key_loc, "%s: argument '%s' given twice", info->name, a->key);
        return -1;
    }
    slot[k] = a->value;
    return 0;
}

/* Puts each argument of call `e` in the slot of its parameter; a variadic op's tensors
 * go to xs. */
static int bind_args(Lower *L, const Expr *e, const OpInfo *info, const Expr **slot,
                     const Expr **xs, int *n_xs)
{
    int variadic = info->n_tensors < 0, rc = 0, np = 0, got = 0, seen_key = 0;
    for (const Arg *a = e->args; a; a = a->next) got++;
    const Expr **pos = arena_alloc(L->tmp, sizeof *pos * (size_t)(got + 1));
    for (const Arg *a = e->args; a; a = a->next) {
        int k;
        if (a->key) {
            seen_key = 1;
        } else if ((k = is_flag_name(info, a->value)) < 0 && seen_key) {  // a bare flag may follow keywords
            diag_error(L->d, a->value->loc, "%s: positional argument after keyword arguments",
                       info->name);
            rc = -1;
        } else if (k >= 0) {
            if (slot[k]) {
                diag_error(L->d, a->value->loc, "%s: argument '%s' given twice", info->name,
                           info->params[k].name);
                rc = -1;
            }
            slot[k] = a->value;
        } else {
            pos[np++] = a->value;
        }
    }
    int first = 0, n_tens = variadic ? np : info->n_tensors;
    if (variadic) {
        while (n_tens > 1 && attr_like(pos[n_tens - 1])) n_tens--;
        if (n_tens > IR_MAX_IN) {
            diag_error(L->d, e->loc, "%s: at most %d tensors, got %d", info->name, IR_MAX_IN, n_tens);
            return -1;
        }
        for (int i = 0; i < n_tens; i++) xs[i] = pos[i];
        *n_xs = n_tens;
        first = 1;
    } else if (np > info->n_params) {
        too_many(L, e, info, got);
        return -1;
    }
    for (int i = variadic ? n_tens : 0; i < np; i++) {
        int k = variadic ? first + i - n_tens : i;
        if (k >= info->n_params) {
            too_many(L, e, info, got);
            return -1;
        }
        if (slot[k]) {
            diag_error(L->d, pos[i]->loc, "%s: argument '%s' given twice", info->name,
                       info->params[k].name);
            rc = -1;
        }
        slot[k] = pos[i];
    }
    for (const Arg *a = e->args; a; a = a->next)  // after positionals: `given twice` at the key
        if (a->key && bind_keyword(L, info, a, slot)) rc = -1;
    if (variadic && *n_xs == 0) {
        diag_error(L->d, e->loc, "%s: expects at least one tensor", info->name);
        rc = -1;
    }
    for (int k = first; k < info->n_params; k++)
        if (!slot[k] && !info->params[k].has_default) {
            diag_error(L->d, e->loc, "%s: missing argument '%s'", info->name, info->params[k].name);
            rc = -1;
        }
    return rc;
}

static int tensor_arg(Lower *L, Scope *s, const OpInfo *info, const char *pname, const Expr *x)
{
    if (x->kind == EX_LIST) {
        diag_error(L->d, x->loc, "%s: argument '%s' must be a tensor, not a list", info->name, pname);
        return -1;
    }
    return one_value(L, lower_expr(L, s, x), x->loc);
}

static int ints_attr(Lower *L, Scope *s, const char *what, const Expr *x, Attr *a)
{
    if (x->kind != EX_LIST) {
        diag_error(L->d, x->loc, "%s must be a list like [B, T, C]", what);
        return -1;
    }
    int64_t items[LOWER_MAX_LIST];
    int n = 0, rc = 0;
    for (const Expr *it = x->items; it; it = it->next) {
        if (n == LOWER_MAX_LIST) {
            diag_error(L->d, it->loc, "%s: at most %d items", what, LOWER_MAX_LIST);
            return -1;
        }
        if (ce_int(L, s, it, what, &items[n++])) rc = -1;
    }
    if (rc) return -1;
    /* A list is a shape or a permutation: its sizes multiply to the elements of a tensor. */
    int64_t numel = 1;
    for (int i = 0; i < n; i++) {
        int64_t v = items[i] < 0 ? (items[i] == INT64_MIN ? INT64_MAX : -items[i]) : items[i];
        if (v > 0 && (__builtin_mul_overflow(numel, v, &numel) || numel > LOWER_MAX_NUMEL)) {
            diag_error(L->d, x->loc, "%s: its sizes multiply to more than 2^48", what);
            return -1;
        }
    }
    int64_t *copy = arena_alloc(L->tmp, sizeof *copy * (size_t)(n + 1));
    memcpy(copy, items, sizeof *items * (size_t)n);
    a->kind = ATTR_INTS;
    a->ints = copy;  // ir_node_add copies them into the graph
    a->n_list = n;
    return 0;
}

/* One attribute, from its argument or its default. */
static int attr_arg(Lower *L, Scope *s, const OpInfo *info, int k, const Expr *x, Attr *a)
{
    const OpParam *p = &info->params[k];
    memset(a, 0, sizeof *a);
    a->key = p->name;
    a->kind = p->kind == ARG_FLOAT ? ATTR_FLOAT : ATTR_INT;
    a->i = (int64_t)p->def;
    a->f = p->def;
    if (!x) return 0;
    char *what = arena_printf(L->tmp, "%s: argument '%s'", info->name, p->name);
    switch (p->kind) {
    case ARG_INT: return ce_int(L, s, x, what, &a->i);
    case ARG_FLOAT: return ce_float(L, s, x, what, &a->f);
    case ARG_INTS: return ints_attr(L, s, what, x, a);
    case ARG_FLAG:
        if (x->kind == EX_NAME && strcmp(x->name, p->name) == 0) {
            a->i = 1;
            return 0;
        }
        if (ce_int(L, s, x, what, &a->i)) return -1;
        if (a->i != 0 && a->i != 1) {
            diag_error(L->d, x->loc, "%s: flag '%s' must be 0 or 1, got %lld", info->name, p->name,
                       (long long)a->i);
            return -1;
        }
        return 0;
    default: FS_ASSERT(!"tensor parameter after attributes"); return -1;
    }
}

static RVal lower_op_call(Lower *L, Scope *s, const Expr *e, OpKind op)
{
    const OpInfo *info = op_info(op);
    const Expr *slot[IR_MAX_PARAMS] = {0}, *xs[IR_MAX_IN];
    int n_xs = 0;
    if (bind_args(L, e, info, slot, xs, &n_xs)) return poison();
    int variadic = info->n_tensors < 0, rc = 0, in[IR_MAX_IN], n_in = 0;
    int first = variadic ? 1 : info->n_tensors;
    if (variadic) {
        for (int i = 0; i < n_xs; i++)
            if ((in[n_in++] = tensor_arg(L, s, info, info->params[0].name, xs[i])) < 0) rc = -1;
    } else if (op == OP_sqrt && slot[0]->kind != EX_LIST) {
        RVal x = lower_expr(L, s, slot[0]);  // sqrt of a constant folds
        if (x.kind == RV_CONST && x.c < 0) {
            diag_error(L->d, e->loc, "sqrt of a negative number (%g)", x.c);
            return poison();
        }
        if (x.kind == RV_CONST) return constant(sqrt(x.c));
        if ((in[n_in++] = one_value(L, x, slot[0]->loc)) < 0) rc = -1;
    } else {
        for (int k = 0; k < first; k++)
            if ((in[n_in++] = tensor_arg(L, s, info, info->params[k].name, slot[k])) < 0) rc = -1;
    }
    Attr attrs[IR_MAX_PARAMS];
    int n_attr = 0;
    for (int k = first; k < info->n_params; k++) {
        if (!slot[k] && info->params[k].def == (double)OPS_NO_IGNORE) continue;  // none: the IR shows no attribute
        if (attr_arg(L, s, info, k, slot[k], &attrs[n_attr++])) rc = -1;
    }
    if (rc) return poison();
    return add_node(L, op, in, n_in, attrs, n_attr, e->loc);
}

/* ---- dropout ------------------------------------------------------------------------ */

/* dropout(x, p): source passes x and p (a constant in [0, 1)); the node gets what makes
 * its mask a pure function of (seed, step, op, element), whatever the strategy
 * (runtime/cpu/dropout.c):
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

int lower_from_batch(Lower *L, int x) { return from_batch(L, x); }

static int batch_leading(Lower *L, int x)
{
    if (!L->batch_dim) return 0;
    const Binding *b = scope_find(&L->model, L->batch_dim);
    const Value *v = ir_value(L->g, x);
    return b && b->kind == B_DIM && v->rank > 0 && v->shape[0] == b->dim && from_batch(L, x);
}

static RVal lower_dropout(Lower *L, Scope *s, const Expr *e)
{
    const OpInfo *info = op_info(OP_dropout);
    OpInfo user = *info;  // what source binds: x and p; the other parameters are the compiler's
    user.sig = "x, p:float";
    user.params[1] = info->params[op_param_index(info, "p")];
    user.n_params = 2, user.n_tensors = 1;
    const Expr *slot[IR_MAX_PARAMS] = {0};
    int n_xs = 0;
    if (bind_args(L, e, &user, slot, NULL, &n_xs)) return poison();
    int x = tensor_arg(L, s, &user, "x", slot[0]);
    double p = 0;
    if (ce_float(L, s, slot[1], "dropout: argument 'p'", &p) || x < 0) return poison();
    if (!(p >= 0 && p < 1)) {
        diag_error(L->d, slot[1]->loc, "dropout: p must be in [0, 1), got %g", p);
        return poison();
    }
    if (p == 0) return value(x);
    int in[2] = {x, rng_input(L)};
    Attr a[5] = {{.key = "p", .kind = ATTR_FLOAT, .f = p},
                 {.key = "key", .kind = ATTR_INT, .i = L->n_dropouts++},
                 {.key = "batch", .kind = ATTR_INT, .i = batch_leading(L, x)},
                 {.key = "mb", .kind = ATTR_INT, .i = 0},
                 {.key = "mbs", .kind = ATTR_INT, .i = L->batch_dim && L->microbatches > 1 ? L->microbatches : 1}};
    return add_node(L, OP_dropout, in, 2, a, 5, e->loc);
}

/* ---- expressions and assignments ------------------------------------------------------ */

static RVal lower_call(Lower *L, Scope *s, const Expr *e)
{
    OpKind op = op_lookup(e->name);
    const Layer *ly = lower_layer_find(L, e->name);
    int first = 0, n = 0;
    InstName *grp = op == OP_COUNT && !ly ? lower_group_find(L, e->name, &first, &n) : NULL;
    if (lower_is_init_name(e->name)) {
        lower_unknown(L, s, e->name, e->loc, 0);
    } else if (op == OP_pow) {
        diag_error(L->d, e->loc, "'pow' is not called by name; write x ** p (p a constant)");
    } else if (grp) {
        return lower_reuse(L, s, e, grp, first, n);
    } else if (op != OP_COUNT && (op_info(op)->flags & OPF_HIDDEN)) {
        diag_error(L->d, e->loc, "'%s' is made by the compiler and cannot be called", e->name);
    } else if (e->kind == EX_INST && !ly) {
        if (op != OP_COUNT)
            diag_error(L->d, e->loc, "'%s' is an op, not a layer; call it as %s(...)", e->name,
                       e->name);
        else
            lower_unknown(L, s, e->name, e->loc, 1);
    } else if (op != OP_COUNT) {
        return op == OP_dropout ? lower_dropout(L, s, e) : lower_op_call(L, s, e, op);
    } else if (ly) {
        return lower_instances(L, s, e, ly);
    } else {
        lower_unknown(L, s, e->name, e->loc, 1);
    }
    return poison();
}

static RVal expr_body(Lower *L, Scope *s, const Expr *e)
{
    switch (e->kind) {
    case EX_NUM: return constant(e->num);
    case EX_NAME: return lower_name(L, s, e);
    case EX_NEG: return lower_neg(L, s, e);
    case EX_BINARY: return lower_binary(L, s, e);
    case EX_CALL:
    case EX_INST: return lower_call(L, s, e);
    case EX_INDEX: return lower_index(L, s, e);
    case EX_SLICE: diag_error(L->d, e->loc, "a slice is only allowed inside x[...]"); break;
    case EX_STR: diag_error(L->d, e->loc, "a string is not a tensor"); break;
    case EX_LIST:
        diag_error(L->d, e->loc,
                   "a list is not a tensor; lists are op arguments, as in reshape(x, [B, T, C])");
        break;
    }
    return poison();
}

RVal lower_expr(Lower *L, Scope *s, const Expr *e)
{
    if (lower_enter(L, e->loc)) return poison();
    RVal r = expr_body(L, s, e);
    L->depth--;
    return r;
}

static int check_targets(Lower *L, const Scope *s, const Stmt *st, int *bad)
{
    int n = 0, rc = 0;
    for (const Name *t = st->targets; t; t = t->next, n++) {
        const Binding *b = scope_find(s, t->name);
        bad[n] = 0;
        const Layer *ly = lower_layer_find(L, t->name);
        if (b && b->kind != B_VALUE) {
            diag_error(L->d, t->loc, "cannot assign to %s '%s'", bind_kind_name(b->kind), t->name);
            diag_note(L->d, b->loc, "'%s' is declared here", t->name);
            bad[n] = 1;
            rc = -1;
        } else if (ly) {
            diag_error(L->d, t->loc, "cannot assign to layer '%s'", t->name);
            diag_note(L->d, ly->def->name_loc, "'%s' is declared here", t->name);
            bad[n] = 1;
            rc = -1;
        }
        for (const Name *u = st->targets; u != t; u = u->next)
            if (strcmp(u->name, t->name) == 0) {
                diag_error(L->d, t->loc, "'%s' is assigned twice in one statement", t->name);
                bad[n] = 1;
                rc = -1;
                break;
            }
    }
    return rc;
}

/* Whether a statement after st (in its body) assigns `name` again. */
static int assigned_later(const Stmt *st, const char *name)
{
    for (const Stmt *u = st->next; u; u = u->next)
        if (u->kind == ST_ASSIGN)
            for (const Name *t = u->targets; t; t = t->next)
                if (!strcmp(t->name, name)) return 1;
    return 0;
}

/* The reports (fsc --mem, --comm, the HTML page) print a value by the name its source
 * gives it: `x = ...` in instance h.3 names it "h.3.x", at model level "x". A name that a
 * later statement of the same body assigns again gets its statement's line ("h.3.x@27"),
 * so the last assignment keeps the plain name. A value already named (a param, an input,
 * the result of an instance, a name bound to another name) keeps its name. */
static void name_assigned(Lower *L, const Stmt *st, const Name *t, int id)
{
    Value *v = &L->g->values[id];
    if (v->name || v->role != ROLE_ACT) return;
    const char *prefix = L->prefix;
    char line[24] = "";
    if (assigned_later(st, t->name)) snprintf(line, sizeof line, "@%d", t->loc.line);
    v->name = prefix ? arena_printf(L->g->arena, "%s.%s%s", prefix, t->name, line)
                     : arena_printf(L->g->arena, "%s%s", t->name, line);
}

void lower_assign(Lower *L, Scope *s, const Stmt *st)
{
    int n = 0, before = L->d->n_errors;
    for (const Name *t = st->targets; t; t = t->next) n++;
    int *bad = arena_alloc(L->tmp, sizeof(int) * (size_t)(n + 1));
    int *ids = arena_alloc(L->tmp, sizeof(int) * (size_t)(n + 1));
    check_targets(L, s, st, bad);
    RVal r = lower_expr(L, s, st->value);
    if (r.kind == RV_CONST) r = value(scalar_of(L, r.c, st->value->loc));
    int got = r.kind == RV_TUPLE ? r.n : 1;
    if (r.kind != RV_POISON && r.id >= 0 && n == 1) {
        ids[0] = r.id;
    } else if (r.kind == RV_TUPLE && got == n) {
        memcpy(ids, r.ids, sizeof(int) * (size_t)n);
    } else if (r.kind == RV_TUPLE || (r.kind == RV_VALUE && n > 1)) {
        diag_error(L->d, st->value->loc, "%s gives %d value%s, but %d name%s assigned",
                   r.kind == RV_TUPLE ? r.what : "this expression", got, got == 1 ? "" : "s", n,
                   n == 1 ? " is" : "s are");
    }
    int failed = L->d->n_errors > before || r.kind == RV_POISON || (r.kind == RV_VALUE && r.id < 0);
    int i = 0;
    for (const Name *t = st->targets; t; t = t->next, i++) {
        if (bad[i]) continue;
        Binding *b = scope_bind(L, s, t->name, B_VALUE, t->loc);
        b->poisoned = failed;
        b->value = failed ? -1 : ids[i];
        if (!failed) name_assigned(L, st, t, ids[i]);
    }
}
