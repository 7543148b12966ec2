/* frontend/settings.c: the `train` block, then the command line's --key value, over the
 * defaults.
 *
 * Each statement sets one or more keys through config_set (ir/config.c), which owns the
 * keys and their accepted values; values pass as the text the user wrote. A bad key is
 * reported at the key, a bad value at the value; command-line errors have no location.
 * `freeze` names and `weight_decay_on` mark the params once they are made
 * (lower_param_groups); `recompute` items are checked against the blocks once they are
 * made (lower_recompute_check).
 *
 *   precision bf16;                      precision = "bf16"
 *   recompute Block, Mlp;                recompute = "Block,Mlp"
 *   optimizer adamw(lr = 6e-4, ...);     optimizer = "adamw", lr = "6e-4", ...
 *                                        (value: the name adamw; args: the keywords)
 *   pipeline(stages = 2, ...);           stages = "2", ...
 */
#include <string.h>

#include "lower.h"

static int known_key(const char *key)
{
    int n;
    const ConfigKey *keys = config_keys(&n);
    for (int i = 0; i < n; i++)
        if (strcmp(keys[i].key, key) == 0) return 1;
    return 0;
}

static void set(Lower *L, TrainConfig *c, const char *key, const char *text, Loc key_loc,
                Loc val_loc)
{
    char err[512] = "";
    if (config_set(c, key, text, err, sizeof err) == 0) return;
    diag_error(L->d, known_key(key) ? val_loc : key_loc, "%s", err[0] ? err : "bad setting");
}

/* The text of a setting's value as written, or NULL after an error. */
static const char *value_text(Lower *L, const Expr *e)
{
    switch (e->kind) {
    case EX_NAME: return e->name;
    case EX_STR: return e->text;
    case EX_NUM: return e->text ? e->text : arena_printf(L->tmp, "%.17g", e->num);
    case EX_NEG:
        if (e->lhs->kind == EX_NUM) {
            const char *t = value_text(L, e->lhs);
            return arena_printf(L->tmp, "-%s", t);
        }
        break;
    default: break;
    }
    diag_error(L->d, e->loc, "a setting's value must be a name, a number or a string");
    return NULL;
}

static void keywords(Lower *L, TrainConfig *c, const char *owner, const Arg *args)
{
    for (const Arg *a = args; a && !L->d->stopped; a = a->next) {
        if (!a->key) {
            diag_error(L->d, a->value->loc, "%s: name each argument, as in lr = 6e-4", owner);
            continue;
        }
        const char *text = value_text(L, a->value);
        if (text) set(L, c, a->key, text, a->key_loc, a->value->loc);
    }
}

static void setting(Lower *L, const Stmt *st, TrainConfig *c)
{
    const Expr *v = st->value;
    if (!strcmp(st->name, "optimizer")) c->optimizer_loc = st->name_loc;
    if (v) {
        size_t len = 0;
        for (const Expr *x = v; x; x = x->next) {
            const char *t = value_text(L, x);
            if (!t) return;
            len += strlen(t) + 1;
        }
        char *text = arena_alloc(L->tmp, len + 1);
        for (const Expr *x = v; x; x = x->next) {
            if (x != v) strcat(text, ",");
            strcat(text, value_text(L, x));
        }
        set(L, c, st->name, text, st->name_loc, v->loc);
    }
    keywords(L, c, st->name, st->args);
}

/* Each item of a command line's list (--recompute A,B; --freeze a,b) through fn; -1 when
 * any failed. */
static int each_item(Lower *L, const char *list, int (*fn)(Lower *, const char *, Loc, const char *))
{
    int rc = 0;
    char *copy = arena_strdup(L->tmp, list);
    for (char *p = copy, *end; p; p = end ? end + 1 : NULL) {
        end = strchr(p, ',');
        if (end) *end = 0;
        while (*p == ' ') p++;
        size_t n = strlen(p);
        while (n > 0 && p[n - 1] == ' ') p[--n] = 0;
        if (fn(L, p, (Loc){0}, "--")) rc = -1;
    }
    return rc;
}

void lower_settings(Lower *L, const Program *p, TrainConfig *c)
{
    for (const Stmt *st = p->train; st && !L->d->stopped; st = st->next) setting(L, st, c);
    for (int i = 0; i < L->opt->n_settings && !L->d->stopped; i++) {
        const Setting *s = &L->opt->settings[i];
        char err[512] = "";
        if (config_set(c, s->key, s->value, err, sizeof err) == 0) continue;
        size_t n = strlen(s->key);
        if (strncmp(err, s->key, n) == 0 && err[n] == ':')
            diag_error(L->d, (Loc){0}, "--%s", err);  // "--precision: unknown value ..."
        else
            diag_error(L->d, (Loc){0}, "--%s: %s", s->key, err[0] ? err : "bad setting");
    }
}

/* ---- freeze and weight_decay_on, once the params are made ---------------------------- */

/* Whether `pat` names param v: its name or a dotted prefix of it (the instance h.0, or
 * every instance of `as h`), its layer (Block), or its layer and its name in the layer
 * (Block.attn.w: that param of every instance). */
static int names_param(const Graph *g, const Value *v, const char *pat)
{
    size_t n = strlen(pat);
    if (!strncmp(v->name, pat, n) && (v->name[n] == 0 || v->name[n] == '.')) return 1;
    if (v->block < 0) return 0;
    const Block *b = &g->blocks[v->block];
    size_t k = strlen(b->layer);
    if (strncmp(pat, b->layer, k) || (pat[k] && pat[k] != '.')) return 0;
    return !pat[k] || !strcmp(pat + k + 1, v->name + strlen(b->name) + 1);
}

static void unknown_freeze(Lower *L, const char *pat, Loc loc, const char *prefix)
{
    Graph *g = L->g;
    const char **cands = arena_alloc(L->tmp, sizeof *cands * ((size_t)g->n_values + 2 * (size_t)g->n_blocks + 1));
    int n = 0;
    cands[n++] = "none";
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].role == ROLE_PARAM && g->values[v].name) cands[n++] = g->values[v].name;
    for (int b = 0; b < g->n_blocks; b++) cands[n++] = g->blocks[b].name, cands[n++] = g->blocks[b].layer;
    const char *best = diag_closest(pat, cands, n);
    if (best)
        diag_error(L->d, loc, "%sfreeze: no param, layer instance or layer named '%s'; did you mean '%s'?", prefix,
                   pat, best);
    else
        diag_error(L->d, loc, "%sfreeze: no param, layer instance or layer named '%s'", prefix, pat);
}

/* Freezes what `pat` names; 0, or -1 after an error. */
static int freeze(Lower *L, const char *pat, Loc loc, const char *prefix)
{
    if (!strcmp(pat, "none")) return 0;
    int hits = 0;
    for (int v = 0; v < L->g->n_values; v++) {
        Value *p = &L->g->values[v];
        if (p->role == ROLE_PARAM && p->name && names_param(L->g, p, pat)) p->frozen = 1, hits++;
    }
    if (!hits) unknown_freeze(L, pat, loc, prefix);
    return hits ? 0 : -1;
}

/* The train block's statement of `key`, when the command line does not override it. */
static const Stmt *last_statement(const Lower *L, const Program *p, const char *key)
{
    for (int i = 0; i < L->opt->n_settings; i++)
        if (!strcmp(L->opt->settings[i].key, key)) return NULL;
    const Stmt *last = NULL;
    for (const Stmt *st = p->train; st; st = st->next)
        if (st->value && !strcmp(st->name, key)) last = st;
    return last;
}

void lower_param_groups(Lower *L, const Program *p, const TrainConfig *t)
{
    Graph *g = L->g;
    const Stmt *st = last_statement(L, p, "freeze");
    int rc = 0;
    if (st)
        for (const Expr *x = st->value; x; x = x->next) rc |= freeze(L, value_text(L, x), x->loc, "");
    else
        rc = each_item(L, t->freeze, freeze);
    int params = 0, trainable = 0;
    for (int v = 0; v < g->n_values; v++) {
        Value *x = &g->values[v];
        if (x->role != ROLE_PARAM) continue;
        if (x->tied_to >= 0) x->frozen = g->values[x->tied_to].frozen;
        x->no_decay |= t->decay_matrices && x->rank < 2;
        params++;
        trainable += !x->frozen;
    }
    if (!rc && params && !trainable)
        diag_error(L->d, st ? st->name_loc : p->loc, "every param is frozen: nothing is left to train");
}

/* ---- recompute, once the blocks are made ------------------------------------------- */

/* Whether block b has an attention op (what `attention:` recomputes). */
static int has_attention(const Graph *g, int b)
{
    for (int n = 0; n < g->n_nodes; n++)
        if (g->nodes[n].block == b && (g->nodes[n].op == OP_attention || g->nodes[n].op == OP_attention_masked))
            return 1;
    return 0;
}

/* One item of `recompute` (ir/config.c: recompute_mode): it must name a block, and with
 * attention: a block with an attention op; 0, or -1 after an error. */
static int check_recompute(Lower *L, const char *item, Loc loc, const char *prefix)
{
    Graph *g = L->g;
    char why[256];
    size_t len = strlen(item);
    if (!strcmp(item, "none")) return 0;
    if (recompute_item_check(item, len, why, sizeof why)) {
        diag_error(L->d, loc, "%srecompute: %s", prefix, why);
        return -1;
    }
    int attention = 0, hits = 0, with_attention = 0;
    for (int b = 0; b < g->n_blocks; b++)
        if (recompute_item_names(item, len, &g->blocks[b], &attention)) hits++, with_attention += has_attention(g, b);
    if (hits && attention && !with_attention) {
        diag_error(L->d, loc, "%srecompute: '%s': no block it names has an attention op to recompute; name the blocks "
                   "that do, or drop attention: to recompute the whole block", prefix, item);
        return -1;
    }
    if (hits) return 0;
    if (!g->n_blocks) {
        diag_error(L->d, loc, "%srecompute: '%s': the model has no layer instances to recompute", prefix, item);
        return -1;
    }
    const char **cands = arena_alloc(L->tmp, sizeof *cands * (2 * (size_t)g->n_blocks + 3));
    int n = 0;
    cands[n++] = "none", cands[n++] = "all", cands[n++] = "attention";
    for (int b = 0; b < g->n_blocks; b++) cands[n++] = g->blocks[b].layer, cands[n++] = g->blocks[b].name;
    const char *target = attention && strchr(item, ':') ? strchr(item, ':') + 1 : item;
    const char *best = diag_closest(target, cands, n);
    const char *first = g->blocks[0].name, *dot = strrchr(first, '.');
    int stem = dot ? (int)(dot - first + 1) : 0;
    char range[96] = "";
    if (g->n_blocks > 1) snprintf(range, sizeof range, " or a range such as %.*s0-1", stem, first);
    diag_error(L->d, loc, "%srecompute: no layer or instance named '%s'%s%s%s (expected none, all, attention, a layer "
               "such as %s, an instance such as %s%s)", prefix, target, best ? "; did you mean '" : "", best ? best : "",
               best ? "'?" : "", g->blocks[0].layer, first, range);
    return -1;
}

void lower_recompute_check(Lower *L, const Program *p, const TrainConfig *t)
{
    const Stmt *st = last_statement(L, p, "recompute");
    if (st)
        for (const Expr *x = st->value; x; x = x->next) check_recompute(L, value_text(L, x), x->loc, "");
    else
        each_item(L, t->recompute, check_recompute);
}
