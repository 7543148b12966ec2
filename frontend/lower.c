/* frontend/lower.c: fe_compile, from source text to a typed, shaped forward graph.
 *
 * The model block is lowered in passes, so declarations may come in any order:
 *   1. every dim, input, param and layer name is declared once (later ones: an error);
 *   2. layers are collected and checked: one forward, which ends in its one return;
 *   3. dims in order (-D overrides), then inputs and params;
 *   4. assignments in order (expr.c), instantiating layers where they are called;
 *   5. the objective `loss`, then the `output` names;
 *   6. the train block, then the command line's settings (settings.c).
 * So messages come in source order (but -D's first: they change everything after),
 * then the command line's settings'.
 * The parser has already checked where each kind of statement may appear.
 * Errors are collected and never cascade; a program with any error gives no graph.
 * Memory: the AST and every scope live in a temporary arena, freed before returning;
 * ir_graph_new, ir_value_add and ir_block_add copy the names the graph keeps.
 */
#include <string.h>

#include "lower.h"

/* ---- declarations ------------------------------------------------------------------- */

static int parse_dtype(Lower *L, const Stmt *st, DType *out)
{
    static const char *const names[] = {"f32", "f16", "bf16", "i32"};
    if (dtype_parse(st->dtype, out) == 0) return 0;
    const char *best = diag_closest(st->dtype, names, 4);
    if (best)
        diag_error(L->d, st->dtype_loc, "unknown dtype '%s'; did you mean '%s'?", st->dtype, best);
    else
        diag_error(L->d, st->dtype_loc, "unknown dtype '%s'; expected f32, f16, bf16 or i32",
                   st->dtype);
    return -1;
}

/* The model's batch dim is the global batch of one optimizer step; each data-parallel
 * rank's program takes its equal part, and with gradient accumulation (`microbatches M`)
 * that part is M micro-batches' worth: the split is world x M (passes/pipeline.c then
 * makes the graph of one micro-batch read its rows of the rank's part). */
static int split_batch(Lower *L, const Stmt *st, int64_t *v)
{
    if (*v % L->batch_split == 0) {
        *v /= L->batch_split;
        return 0;
    }
    if (L->microbatches > 1)
        diag_error(L->d, st->name_loc,
                   "the batch dim %s = %lld (the global batch of one step) does not split evenly over %lld "
                   "data-parallel rank%s x %lld micro-batches; make it a multiple of %lld",
                   st->name, (long long)*v, (long long)L->world, L->world == 1 ? "" : "s", (long long)L->microbatches,
                   (long long)L->batch_split);
    else
        diag_error(L->d, st->name_loc,
                   "the batch dim %s = %lld (the global batch of one step) does not split evenly over %lld "
                   "data-parallel ranks; make it a multiple of %lld",
                   st->name, (long long)*v, (long long)L->batch_split, (long long)L->batch_split);
    return -1;
}

/* shard_group S (hybrid sharding) splits each stage's D data-parallel ranks into groups
 * of S: only a sharded strategy has shards, and S must divide D. Reported at the train
 * block's statement unless the command line set it. */
static void check_shard_group(Lower *L, const Program *p, const TrainConfig *t)
{
    int dp = t->stages > 1 ? t->world / t->stages : t->world;
    if (!t->shard_group || (t->shard != SHARD_NONE && t->shard != SHARD_DDP && dp % t->shard_group == 0)) return;
    Loc at = {0};
    for (const Stmt *st = p->train; st; st = st->next)
        if (!strcmp(st->name, "shard_group") && st->value) at = st->value->loc;
    for (int i = 0; i < L->opt->n_settings; i++)
        if (!strcmp(L->opt->settings[i].key, "shard_group")) at = (Loc){0};
    if (t->shard == SHARD_NONE || t->shard == SHARD_DDP) {
        diag_error(L->d, at, "shard_group %d needs a sharded strategy: --shard zero1, zero2 or fsdp (%s shards nothing)",
                   t->shard_group, shard_name(t->shard));
        return;
    }
    char valid[256] = "";
    for (int s = 1, n = 0; s <= dp && n < 24; s++)
        if (dp % s == 0) n++, snprintf(valid + strlen(valid), sizeof valid - strlen(valid), "%s%d", *valid ? ", " : "", s);
    diag_error(L->d, at, "shard_group %d does not divide the %d data-parallel ranks%s; valid values: %s (or 0: all of "
               "them)", t->shard_group, dp, t->stages > 1 ? " of a stage" : "", valid);
}

/* With several data-parallel ranks or micro-batches: the batch dim is the first dim of
 * the first input, which must be a plain dim name for fsc to split it. */
static void find_batch_dim(Lower *L, const Stmt *body, const TrainConfig *t)
{
    /* Each data-parallel rank (the world over the pipeline stages) takes its part, in
     * M micro-batches (one stage: gradient accumulation; several: the pipeline's). */
    int64_t m = t->microbatches > 1 ? t->microbatches : 1;
    if (t->stages > 1 && t->world % t->stages) {
        diag_error(L->d, (Loc){0}, "world %d does not split into %d pipeline stages; make the world a multiple of the "
                   "stages (world = stages x data-parallel ranks)", t->world, t->stages);
        return;
    }
    int dp = t->stages > 1 ? t->world / t->stages : t->world;
    if (dp <= 1 && m <= 1) return;
    for (const Stmt *st = body; st; st = st->next) {
        if (st->kind != ST_INPUT) continue;
        if (st->shape && st->shape->kind == EX_NAME) {
            L->batch_dim = st->shape->name;
            L->world = dp;
            L->microbatches = m;
            L->batch_split = (int64_t)dp * m;
        } else if (dp > 1) {
            diag_error(L->d, st->shape ? st->shape->loc : st->name_loc,
                       "with %s %d, the first dim of input '%s' must be a dim name (the batch, which "
                       "fsc splits over the ranks), as in `input %s: i32[B, T];`",
                       t->stages > 1 ? "data-parallel ranks" : "world", dp, st->name, st->name);
        } else {
            diag_error(L->d, st->shape ? st->shape->loc : st->name_loc,
                       "with microbatches %lld, the first dim of input '%s' must be a dim name (the batch, which "
                       "fsc splits into micro-batches), as in `input %s: i32[B, T];`",
                       (long long)m, st->name, st->name);
        }
        return;
    }
}

void lower_dim(Lower *L, Scope *s, const Stmt *st, const Define *def)
{
    int64_t v = 0;
    int rc = 0;
    if (def) {
        v = def->value;
        if (v <= 0) {
            diag_error(L->d, (Loc){0}, "-D %s=%lld: dims must be positive", def->name, (long long)v);
            rc = -1;
        }
    } else {
        char *what = arena_printf(L->tmp, "dim '%s'", st->name);
        rc = ce_int(L, s, st->value, what, &v);
        if (rc == 0 && v <= 0) {
            diag_error(L->d, st->name_loc, "dim '%s' must be positive, but it is %lld", st->name,
                       (long long)v);
            rc = -1;
        }
    }
    if (rc == 0 && s == &L->model)  // the model's dims, recorded in the plan (a resume compares them)
        L->g->dims = arena_printf(L->g->arena, "%s%s%s=%lld", L->g->dims ? L->g->dims : "", L->g->dims ? " " : "",
                                  st->name, (long long)v);
    if (rc == 0 && L->batch_dim && s == &L->model && !strcmp(st->name, L->batch_dim)) rc = split_batch(L, st, &v);
    Binding *b = scope_bind(L, s, st->name, B_DIM, st->name_loc);
    b->dim = v;
    b->poisoned = rc != 0;
}

static int init_value(Lower *L, Scope *s, const Stmt *st, Value *v)
{
    memset(v, 0, sizeof *v);
    v->block = -1;
    v->producer = -1;
    v->tied_to = -1;
    v->loc = st->name_loc;
    v->place = PLACE_DEVICE;
    return ce_shape(L, s, st->shape, arena_printf(L->tmp, "'%s'", st->name), st->name_loc, v);
}

static void lower_input(Lower *L, const Stmt *st)
{
    Value v;
    int rc = 0;
    DType dt = DT_F32;
    if (!st->dtype) {
        diag_error(L->d, st->name_loc, "input '%s' needs a dtype, as in `input %s: i32[B, T];`",
                   st->name, st->name);
        rc = -1;
    } else if (parse_dtype(L, st, &dt)) {
        rc = -1;
    }
    if (init_value(L, &L->model, st, &v)) rc = -1;
    v.dtype = dt;
    v.role = ROLE_INPUT;
    v.name = st->name;
    Binding *b = scope_bind(L, &L->model, st->name, B_INPUT, st->name_loc);
    b->poisoned = rc != 0;
    if (rc == 0) b->value = ir_value_add(L->g, &v);
}

int lower_param(Lower *L, Scope *s, const Stmt *st, const char *full, int block)
{
    Value v;
    int rc = 0;
    DType dt = DT_F32;
    if (st->dtype && parse_dtype(L, st, &dt)) {
        rc = -1;
    } else if (!dtype_is_float(dt)) {
        diag_error(L->d, st->dtype_loc, "param '%s' must be f32, f16 or bf16, not %s", st->name,
                   st->dtype);
        rc = -1;
    }
    if (init_value(L, s, st, &v)) rc = -1;
    if (!st->value) {
        diag_error(L->d, st->name_loc,
                   "param '%s' needs an initializer: = zeros, ones, normal(std) or uniform(low, high)",
                   st->name);
        rc = -1;
    } else if (ce_init(L, s, st->value, &v)) {
        rc = -1;
    }
    if (rc) return -1;
    v.dtype = dt;
    v.role = ROLE_PARAM;
    v.block = block;
    v.name = full;
    for (const Name *f = st->targets; f; f = f->next) {  // the parser checked them
        v.frozen |= !strcmp(f->name, "frozen");
        v.no_decay |= !strcmp(f->name, "no_decay");
    }
    return ir_value_add(L->g, &v);
}

/* ---- pass 1: one definition per name --------------------------------------------------- */

typedef struct {
    const char *name;
    Loc loc;
} Decl;

static int declares(const Stmt *st)
{
    return st->kind == ST_DIM || st->kind == ST_INPUT || st->kind == ST_PARAM || st->kind == ST_LAYER;
}

static int redefined(Lower *L, Decl *seen, int n, const char *name, Loc loc)
{
    for (int i = 0; i < n; i++)
        if (strcmp(seen[i].name, name) == 0) {
            diag_error(L->d, loc, "redefinition of '%s'", name);
            diag_note(L->d, seen[i].loc, "previous definition of '%s' was here", name);
            return 1;
        }
    return 0;
}

/* Reports later definitions of a name; marks their statements in dup. */
static void check_redefinitions(Lower *L, const Stmt *body, char *dup)
{
    int n = 0, i = 0;
    for (const Stmt *st = body; st; st = st->next) n++;
    Decl *seen = arena_alloc(L->tmp, sizeof *seen * (size_t)(n + 1));
    int k = 0;
    for (const Stmt *st = body; st; st = st->next, i++) {
        if (!declares(st)) continue;
        dup[i] = (char)redefined(L, seen, k, st->name, st->name_loc);
        if (!dup[i]) seen[k++] = (Decl){st->name, st->name_loc};
    }
}

/* ---- pass 2: layers ---------------------------------------------------------------------- */

static void layer_body(Lower *L, Layer *ly)
{
    int n = 0;
    for (const Stmt *st = ly->def->body; st; st = st->next) n++;
    Decl *seen = arena_alloc(L->tmp, sizeof *seen * (size_t)(n + 1));
    int k = 0;
    for (const Stmt *st = ly->def->body; st; st = st->next) {
        if (redefined(L, seen, k, st->name, st->name_loc))
            ly->ok = 0;
        else
            seen[k++] = (Decl){st->name, st->name_loc};
    }
}

static void layer_forward(Lower *L, Layer *ly)
{
    const Stmt *def = ly->def;
    for (const Name *a = def->targets; a; a = a->next) {
        for (const Name *b = def->targets; b != a; b = b->next)
            if (strcmp(a->name, b->name) == 0) {
                diag_error(L->d, a->loc, "forward argument '%s' appears twice", a->name);
                ly->ok = 0;
            }
        ly->n_args++;
    }
    if (ly->n_args > IR_MAX_IN) {
        diag_error(L->d, def->fwd_loc, "forward takes at most %d arguments", IR_MAX_IN);
        ly->ok = 0;
    }
    for (const Stmt *st = def->fwd; st; st = st->next) {
        if (ly->ret) {
            diag_error(L->d, st->loc, "statement after return");
            ly->ok = 0;
            break;
        }
        if (st->kind == ST_RETURN) ly->ret = st;
    }
    if (!ly->ret) {
        diag_error(L->d, def->fwd_loc, "forward of '%s' has no return", def->name);
        ly->ok = 0;
        return;
    }
    for (const Expr *x = ly->ret->value; x; x = x->next) ly->n_ret++;
    if (ly->n_ret == 0) {
        diag_error(L->d, ly->ret->loc, "return needs at least one value");
        ly->ok = 0;
    }
}

static void collect_layers(Lower *L, const Stmt *body, const char *dup)
{
    int n = 0, i = 0;
    for (const Stmt *st = body; st; st = st->next) n += st->kind == ST_LAYER;
    L->layers = arena_alloc(L->tmp, sizeof *L->layers * (size_t)(n + 1));
    for (const Stmt *st = body; st; st = st->next, i++) {
        if (st->kind != ST_LAYER || dup[i]) continue;
        Layer *ly = &L->layers[L->n_layers++];
        *ly = (Layer){.def = st, .ok = 1};
        OpKind op = op_lookup(st->name);
        if (op != OP_COUNT || lower_is_init_name(st->name)) {
            diag_error(L->d, st->name_loc, "layer '%s' has the name of %s", st->name,
                       op != OP_COUNT ? "an op" : "an initializer");
            ly->ok = 0;
        }
        layer_body(L, ly);
        if (st->fwd_loc.line == 0) {
            diag_error(L->d, st->name_loc, "layer '%s' has no forward", st->name);
            ly->ok = 0;
        } else {
            layer_forward(L, ly);
        }
    }
}

/* ---- passes 3-5: the model ---------------------------------------------------------------- */

/* The -D for dim `name` (the last one wins), or NULL. */
static const Define *define_for(const Lower *L, const char *name)
{
    const Define *found = NULL;
    for (int i = 0; i < L->opt->n_defines; i++)
        if (strcmp(L->opt->defines[i].name, name) == 0) found = &L->opt->defines[i];
    return found;
}

static void check_defines(Lower *L, const Stmt *body)
{
    int n = 0;
    for (const Stmt *st = body; st; st = st->next) n += st->kind == ST_DIM;
    const char **dims = arena_alloc(L->tmp, sizeof *dims * (size_t)(n + 1));
    n = 0;
    for (const Stmt *st = body; st; st = st->next)
        if (st->kind == ST_DIM) dims[n++] = st->name;
    for (int i = 0; i < L->opt->n_defines; i++) {
        const char *name = L->opt->defines[i].name;
        int found = 0;
        for (int k = 0; k < n && !found; k++) found = strcmp(dims[k], name) == 0;
        if (found) continue;
        const char *best = diag_closest(name, dims, n);
        if (best)
            diag_error(L->d, (Loc){0}, "-D %s: the model has no dim '%s'; did you mean '%s'?", name,
                       name, best);
        else
            diag_error(L->d, (Loc){0}, "-D %s: the model has no dim '%s'", name, name);
    }
}

static void lower_decls(Lower *L, const Stmt *body, const char *dup)
{
    int i = 0;
    for (const Stmt *st = body; st && !L->d->stopped; st = st->next, i++)
        if (st->kind == ST_DIM && !dup[i]) lower_dim(L, &L->model, st, define_for(L, st->name));
    i = 0;
    for (const Stmt *st = body; st && !L->d->stopped; st = st->next, i++) {
        if (dup[i]) continue;
        if (st->kind == ST_INPUT) lower_input(L, st);
        if (st->kind != ST_PARAM) continue;
        int id = lower_param(L, &L->model, st, st->name, -1);
        Binding *b = scope_bind(L, &L->model, st->name, B_PARAM, st->name_loc);
        b->value = id;
        b->poisoned = id < 0;
    }
}

/* A warning on the first input fsexec cannot feed from --data (ops/feed.c's rule, the
 * one fsexec refuses by): the plan still compiles, for --mem and for other runtimes. */
static void warn_unfed(Lower *L, const Program *p, const char *dup)
{
    int i = 0;
    for (const Stmt *st = p->body; st; st = st->next, i++) {
        const Binding *b = st->kind == ST_INPUT && !dup[i] ? scope_find(&L->model, st->name) : NULL;
        if (!b || b->poisoned) continue;
        const Value *v = ir_value(L->g, b->value);
        OpType in = {.dtype = v->dtype, .rank = v->rank};
        for (int k = 0; k < v->rank; k++) in.shape[k] = v->shape[k];
        char why[256];
        if (op_input_unfed(&in, why, sizeof why)) {
            diag_warning(L->d, st->name_loc, "fsexec cannot feed input '%s' from --data: %s", st->name, why);
            return;
        }
    }
}

static void lower_statements(Lower *L, const Stmt *body)
{
    for (const Stmt *st = body; st && !L->d->stopped; st = st->next) {
        L->depth = 0;
        if (st->kind == ST_ASSIGN) lower_assign(L, &L->model, st);
    }
}

/* Outputs are found by name in the plan (the runtime logs "loss", reports accuracy
 * from "logits"): an output that is an intermediate takes the model-level name it is
 * bound to, over the one its assignment gave it (a block's "h.3.x"). */
static void name_value(Lower *L, int v, const char *name)
{
    Value *val = &L->g->values[v];
    if (!val->name || val->role == ROLE_ACT) val->name = arena_strdup(L->g->arena, name);
}

static void add_output(Lower *L, const Name *nm)
{
    const Binding *b = scope_find(&L->model, nm->name);
    if (!b) {
        lower_unknown(L, &L->model, nm->name, nm->loc, 0);
        return;
    }
    if (b->poisoned) return;
    if (b->kind == B_DIM) {
        diag_error(L->d, nm->loc, "output '%s' is a dim, not a tensor", nm->name);
        return;
    }
    for (int i = 0; i < L->g->n_outputs; i++)
        if (L->g->outputs[i] == b->value) return;
    name_value(L, b->value, nm->name);
    ir_output_add(L->g, b->value);
}

static void lower_objective(Lower *L, const Program *p)
{
    const Binding *b = scope_find(&L->model, "loss");
    if (!b)
        diag_error(L->d, p->loc,
                   "model '%s' does not assign 'loss', its objective (an f32 scalar), as in "
                   "`loss = cross_entropy(logits, targets);`",
                   p->name);
    const Value *v = !b || b->kind == B_DIM || b->poisoned ? NULL : ir_value(L->g, b->value);
    if (v && v->dtype == DT_F32 && v->rank == 0) {
        name_value(L, b->value, "loss");
        ir_output_add(L->g, b->value);
    } else if (b && !b->poisoned) {
        char buf[256];
        diag_error(L->d, b->loc, "'loss' must be an f32 scalar, but it is %s",
                   v ? ir_type_str(v, buf, sizeof buf) : "a dim");
    }
    for (const Stmt *st = p->body; st; st = st->next)
        if (st->kind == ST_OUTPUT)
            for (const Name *nm = st->targets; nm && !L->d->stopped; nm = nm->next) add_output(L, nm);
}

Graph *fe_compile(const char *src, size_t len, const FrontendOptions *opt, TrainConfig *train,
                  Diag *d)
{
    static const FrontendOptions no_options;
    TrainConfig scratch;
    if (!train) train = &scratch;
    config_default(train);
    int before = d->n_errors;
    Arena *tmp = arena_new();
    Program *p = fe_parse(src, len, tmp, d);
    if (!p || d->n_errors > before) {
        arena_free(tmp);
        return NULL;
    }
    Lower L = {.tmp = tmp, .d = d, .opt = opt ? opt : &no_options, .block = -1, .body = p->body, .rng = -1};
    L.g = ir_graph_new(p->name);
    scope_init(&L.model, NULL);
    int n = 0;
    for (const Stmt *st = p->body; st; st = st->next) n++;
    char *dup = arena_alloc(tmp, (size_t)n + 1);
    check_redefinitions(&L, p->body, dup);
    collect_layers(&L, p->body, dup);
    check_defines(&L, p->body);
    /* Settings first: the world decides each rank's share of the batch. */
    lower_settings(&L, p, train);
    if (d->n_errors == before) find_batch_dim(&L, p->body, train);
    if (d->n_errors == before) check_shard_group(&L, p, train);
    lower_decls(&L, p->body, dup);
    for (const Stmt *st = p->body; st; st = st->next)  // the batch dim a resume may change (any world)
        if (st->kind == ST_INPUT) {
            if (st->shape && st->shape->kind == EX_NAME) L.g->batch_dim = arena_strdup(L.g->arena, st->shape->name);
            break;
        }
    if (d->n_errors == before) warn_unfed(&L, p, dup);
    lower_statements(&L, p->body);
    if (!d->stopped) lower_objective(&L, p);
    if (d->n_errors == before) lower_param_groups(&L, p, train);
    if (d->n_errors == before) lower_recompute_check(&L, p, train);
    arena_free(tmp);
    if (d->n_errors > before) {
        ir_graph_free(L.g);
        return NULL;
    }
    FS_ASSERT(ir_verify(L.g, stderr) == 0);
    return L.g;
}
