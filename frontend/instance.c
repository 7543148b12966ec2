/* frontend/instance.c: layer instances, made and applied.
 *
 *   Layer(args), Layer[N](args) [as NAME]   N new instances NAME.0 ... NAME.{N-1} (NAME "h"
 *                                           without `as`), each a block with params of its
 *                                           own, applied in a chain
 *   NAME(args), NAME[N](args)               the group's instances applied again, in the same
 *   NAME.i(args)                            chain (N times over), or instance i alone
 *
 * A chain feeds the results of one application to the next as its first arguments; the
 * remaining arguments go unchanged to every one. Applying an instance again lowers its
 * forward once more with its block and its params (one set of params shared by every
 * application: ALBERT, universal transformers), so autodiff sums the gradients of all the
 * uses into one per param, and the passes that work per block (shard's flat units and
 * gathers, recompute, the pipeline stage) treat the block as one unit, however often it
 * appears in the forward. The values of application k > 1 are named "NAME.i#k.x" for the
 * reports; each application draws its own dropout masks (its dropouts get new keys), as
 * a PyTorch module called twice does.
 *
 * Where it sits: lower_call (expr.c) calls lower_instances for a layer's name and
 * lower_reuse for a group's (lower_group_find).
 */
#include <stdlib.h>
#include <string.h>

#include "lower.h"

static RVal poison(void) { return (RVal){.kind = RV_POISON, .id = -1}; }

/* Lowers application `use` (0: the first, which makes the params) of instance i of
 * group grp; its return values into ret. */
static int lower_instance(Lower *L, InstName *grp, int i, const int *args, int *ret)
{
    const Layer *ly = grp->layer;
    const Stmt *def = ly->def;
    int block = grp->first_block + i, use = grp->uses[i]++, k = 0;
    int *params = &grp->params[(size_t)i * (size_t)grp->n_params];
    const char *name = L->g->blocks[block].name;
    Scope sc;
    scope_init(&sc, &L->model);
    const Layer *saved_layer = L->in_layer;
    const char *saved_prefix = L->prefix;
    int saved_block = L->block, saved_use = L->use, rc = 0;
    L->in_layer = ly;
    L->block = block;
    L->use = use;
    L->prefix = use ? arena_printf(L->tmp, "%s#%d", name, use + 1) : name;
    for (const Stmt *st = def->body; st; st = st->next) {
        if (st->kind == ST_DIM) lower_dim(L, &sc, st, NULL);
        if (st->kind != ST_PARAM) continue;
        if (!use) params[k] = lower_param(L, &sc, st, arena_printf(L->tmp, "%s.%s", name, st->name), block);
        Binding *b = scope_bind(L, &sc, st->name, B_PARAM, st->name_loc);
        b->value = params[k];
        b->poisoned = params[k] < 0;
        if (params[k++] < 0) rc = -1;
    }
    int j = 0;
    for (const Name *nm = def->targets; nm; nm = nm->next, j++)
        scope_bind(L, &sc, nm->name, B_VALUE, nm->loc)->value = args[j];
    for (const Stmt *st = def->fwd; st && !L->d->stopped; st = st->next) {
        if (st->kind == ST_ASSIGN) lower_assign(L, &sc, st);
        if (st->kind != ST_RETURN) continue;
        j = 0;
        for (const Expr *x = st->value; x; x = x->next, j++)
            if ((ret[j] = lower_one_value(L, lower_expr(L, &sc, x), x->loc)) < 0) rc = -1;
        break;
    }
    L->in_layer = saved_layer;
    L->block = saved_block;
    L->use = saved_use;
    L->prefix = saved_prefix;
    return rc;
}

/* Chained instances must return what they take: result j feeds argument j. */
static int check_chain(Lower *L, const Expr *e, const Layer *ly, int64_t count, const int *args,
                       const int *ret)
{
    for (int j = 0; j < ly->n_ret; j++) {
        const Value *r = ir_value(L->g, ret[j]), *a = ir_value(L->g, args[j]);
        int same = r->dtype == a->dtype && r->rank == a->rank;
        for (int i = 0; same && i < r->rank; i++) same = r->shape[i] == a->shape[i];
        if (same) continue;
        char rb[128], ab[128];
        diag_error(L->d, e->loc,
                   "%s[%lld]: chained instances must return what they take, but result %d is %s "
                   "and argument %d is %s",
                   e->name, (long long)count, j + 1, ir_type_str(r, rb, sizeof rb), j + 1,
                   ir_type_str(a, ab, sizeof ab));
        if (ly->ret) diag_note(L->d, ly->ret->loc, "'%s' returns here", ly->def->name);
        return -1;
    }
    return 0;
}

/* `as NAME` (or the default "h") must name one group of instances only, and no
 * model-level name may look like one of theirs (h.0.w). The group's index, or -1. */
static int claim_name(Lower *L, const char *name, Loc loc, int explicit)
{
    size_t len = strlen(name);
    for (const Stmt *st = L->body; st; st = st->next) {
        int decl = st->kind == ST_DIM || st->kind == ST_INPUT || st->kind == ST_PARAM;
        if (!decl || strncmp(st->name, name, len) != 0 || st->name[len] != '.') continue;
        diag_error(L->d, loc, "instance name '%s' clashes with the name of %s '%s'%s", name,
                   st->kind == ST_INPUT ? "input" : st->kind == ST_DIM ? "dim" : "param",
                   st->name, explicit ? "" : "; name the instances with `as NAME`");
        diag_note(L->d, st->name_loc, "'%s' is declared here", st->name);
        return -1;
    }
    for (int i = 0; i < L->n_insts; i++) {
        if (strcmp(L->insts[i].name, name) != 0) continue;
        if (explicit)
            diag_error(L->d, loc, "instance name '%s' is already used; to apply those instances again (shared "
                       "params), call them: %s(...)", name, name);
        else
            diag_error(L->d, loc, "instances named '%s' already exist; name these with `as NAME`",
                       name);
        diag_note(L->d, L->insts[i].loc, "'%s' was first used here", name);
        return -1;
    }
    L->insts = arena_grow(L->tmp, L->insts, &L->cap_insts, L->n_insts + 1, sizeof *L->insts);
    L->insts[L->n_insts] = (InstName){.name = name, .loc = loc};
    return L->n_insts++;
}

static int inst_args(Lower *L, Scope *s, const Expr *e, const Layer *ly, int *args)
{
    int n = 0, rc = 0;
    for (const Arg *a = e->args; a; a = a->next, n++) {
        if (a->key) {
            diag_error(L->d, a->key_loc, "%s: layer arguments are positional; drop '%s ='",
                       e->name, a->key);
            rc = -1;
            continue;
        }
        int id = lower_one_value(L, lower_expr(L, s, a->value), a->value->loc);
        if (n < IR_MAX_IN) args[n] = id;
        if (id < 0) rc = -1;
    }
    if (n != ly->n_args) {
        diag_error(L->d, e->loc, "%s: expects %d argument%s, got %d", e->name, ly->n_args,
                   ly->n_args == 1 ? "" : "s", n);
        diag_note(L->d, ly->def->fwd_loc, "'%s' takes its arguments here", e->name);
        return -1;
    }
    return rc;
}

/* Applies instances [first, first + n) of group grp in a chain, `times` over, from args
 * (which it updates along the chain); e is the call, for messages. */
static RVal apply(Lower *L, const Expr *e, InstName *grp, int first, int n, int64_t times, int *args)
{
    const Layer *ly = grp->layer;
    int64_t total = (int64_t)n * times, k = 0;
    if (total > 1 && ly->n_ret > ly->n_args) {
        diag_error(L->d, e->loc,
                   "%s[%lld]: each instance's %d results feed the next one, which takes %d argument%s",
                   e->name, (long long)total, ly->n_ret, ly->n_args, ly->n_args == 1 ? "" : "s");
        return poison();
    }
    int *ret = arena_alloc(L->tmp, sizeof(int) * (size_t)ly->n_ret);
    for (int64_t t = 0; t < times; t++)
        for (int i = first; i < first + n; i++, k++) {
            int before = L->d->n_errors;
            if (grp->uses[i] == 0) {
                const char *name = arena_printf(L->tmp, "%s.%d", grp->name, i);
                FS_ASSERT(ir_block_add(L->g, name, ly->def->name, i) == grp->first_block + i);
            }
            if (lower_too_big(L, e->loc) || lower_instance(L, grp, i, args, ret) || L->d->n_errors > before)
                return poison();
            if (total > 1 && k == 0 && check_chain(L, e, ly, total, args, ret)) return poison();
            for (int j = 0; j < ly->n_ret && k + 1 < total; j++) args[j] = ret[j];
        }
    return ly->n_ret == 1 ? (RVal){.kind = RV_VALUE, .id = ret[0]} : lower_tuple(L, ret, ly->n_ret, ly->def->name);
}

/* The count N of Layer[N](...) or NAME[N](...); 1 without one. */
static int call_count(Lower *L, Scope *s, const Expr *e, int64_t *count)
{
    *count = 1;
    if (e->kind != EX_INST || !e->count) return 0;
    char *what = arena_printf(L->tmp, "the count of %s[N]", e->name);
    if (ce_int(L, s, e->count, what, count)) return -1;
    if (*count < 1 || *count > LOWER_MAX_INSTANCES) {
        diag_error(L->d, e->count->loc, "%s[%lld]: the count must be between 1 and %d",
                   e->name, (long long)*count, LOWER_MAX_INSTANCES);
        return -1;
    }
    return 0;
}

static int not_nested(Lower *L, const Expr *e)
{
    if (!L->in_layer) return 0;
    diag_error(L->d, e->loc, "layers cannot be nested: '%s' is used inside the forward of '%s'",
               e->name, L->in_layer->def->name);
    return -1;
}

RVal lower_instances(Lower *L, Scope *s, const Expr *e, const Layer *ly)
{
    if (not_nested(L, e)) return poison();
    int64_t count = 1;
    int rc = call_count(L, s, e, &count);
    int named = e->kind == EX_INST && e->as_name;
    const char *base = named ? e->as_name : "h";
    int args[IR_MAX_IN];
    if (ly->n_args > IR_MAX_IN || inst_args(L, s, e, ly, args)) rc = -1;
    /* After the arguments: in `Layer(NAME(x)) as NAME`, NAME is not a group yet. */
    int gi = claim_name(L, base, named ? e->as_loc : e->loc, named);
    if (gi < 0) rc = -1;
    if (rc || !ly->ok) return poison();
    InstName *grp = &L->insts[gi];
    int n_params = 0;
    for (const Stmt *st = ly->def->body; st; st = st->next) n_params += st->kind == ST_PARAM;
    *grp = (InstName){.name = base, .loc = grp->loc, .layer = ly, .first_block = L->g->n_blocks, .count = (int)count,
                      .n_params = n_params};
    grp->params = arena_alloc(L->tmp, sizeof(int) * (size_t)(count * n_params + 1));
    grp->uses = arena_alloc(L->tmp, sizeof(int) * (size_t)count);
    memset(grp->uses, 0, sizeof(int) * (size_t)count);
    RVal r = apply(L, e, grp, 0, (int)count, 1, args);
    if (r.kind == RV_POISON) L->insts[gi].layer = NULL;  // applied again: silently poison
    return r;
}

InstName *lower_group_find(Lower *L, const char *name, int *first, int *n)
{
    for (int i = 0; i < L->n_insts; i++) {
        InstName *g = &L->insts[i];
        size_t len = strlen(g->name);
        if (strncmp(name, g->name, len) != 0) continue;
        if (!name[len]) {
            *first = 0, *n = g->count;
            return g;
        }
        char *end = NULL;
        int digit = name[len] == '.' && name[len + 1] >= '0' && name[len + 1] <= '9' &&
                    !(name[len + 1] == '0' && name[len + 2]);  // NAME.i as the blocks are named: h.0, not h.00
        long k = digit ? strtol(name + len + 1, &end, 10) : -1;
        if (k >= 0 && !*end && (!g->layer || k < g->count)) {
            *first = (int)k, *n = 1;
            return g;
        }
    }
    return NULL;
}

RVal lower_reuse(Lower *L, Scope *s, const Expr *e, InstName *grp, int first, int n)
{
    if (not_nested(L, e)) return poison();
    if (e->kind == EX_INST && e->as_name) {
        diag_error(L->d, e->as_loc, "'as' names new instances, but %s(...) applies instances that exist; for new "
                   "ones call the layer", e->name);
        return poison();
    }
    int64_t times = 1;
    int rc = call_count(L, s, e, &times), args[IR_MAX_IN];
    if (!grp->layer) return poison();  // its instances failed, with their error
    if (inst_args(L, s, e, grp->layer, args)) rc = -1;
    if (rc) return poison();
    return apply(L, e, grp, first, n, times, args);
}
