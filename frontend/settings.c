/* frontend/settings.c: the `train` block, then the command line's --key value, over the
 * defaults.
 *
 * Each statement sets one or more keys through config_set (ir/config.c), which owns the
 * keys and their accepted values; values pass as the text the user wrote. A bad key is
 * reported at the key, a bad value at the value; command-line errors have no location.
 * `recompute` names are checked here, where the model's layers are known.
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

/* none, all, or a layer; 0 when it is one. */
static int check_recompute(Lower *L, const char *name, Loc loc, const char *prefix)
{
    if (strcmp(name, "none") == 0 || strcmp(name, "all") == 0 || lower_layer_find(L, name))
        return 0;
    const char **cands = arena_alloc(L->tmp, sizeof *cands * (size_t)(L->n_layers + 2));
    int n = 0;
    cands[n++] = "none";
    cands[n++] = "all";
    for (int i = 0; i < L->n_layers; i++) cands[n++] = L->layers[i].def->name;
    const char *best = diag_closest(name, cands, n);
    if (best)
        diag_error(L->d, loc, "%srecompute: no layer named '%s'; did you mean '%s'?", prefix, name,
                   best);
    else
        diag_error(L->d, loc, "%srecompute: no layer named '%s' (expected none, all or layer names)",
                   prefix, name);
    return -1;
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
        int recompute = strcmp(st->name, "recompute") == 0, rc = 0;
        size_t len = 0;
        for (const Expr *x = v; x; x = x->next) {
            const char *t = value_text(L, x);
            if (!t) return;
            if (recompute && check_recompute(L, t, x->loc, "")) rc = -1;
            len += strlen(t) + 1;
        }
        if (rc) return;
        char *text = arena_alloc(L->tmp, len + 1);
        for (const Expr *x = v; x; x = x->next) {
            if (x != v) strcat(text, ",");
            strcat(text, value_text(L, x));
        }
        set(L, c, st->name, text, st->name_loc, v->loc);
    }
    keywords(L, c, st->name, st->args);
}

/* --recompute A,B from the command line. */
static int check_recompute_list(Lower *L, const char *list)
{
    int rc = 0;
    char *copy = arena_strdup(L->tmp, list);
    for (char *p = copy, *end; p; p = end ? end + 1 : NULL) {
        end = strchr(p, ',');
        if (end) *end = 0;
        while (*p == ' ') p++;
        size_t n = strlen(p);
        while (n > 0 && p[n - 1] == ' ') p[--n] = 0;
        if (check_recompute(L, p, (Loc){0}, "--")) rc = -1;
    }
    return rc;
}

void lower_settings(Lower *L, const Program *p, TrainConfig *c)
{
    for (const Stmt *st = p->train; st && !L->d->stopped; st = st->next) setting(L, st, c);
    for (int i = 0; i < L->opt->n_settings && !L->d->stopped; i++) {
        const Setting *s = &L->opt->settings[i];
        if (strcmp(s->key, "recompute") == 0 && check_recompute_list(L, s->value)) continue;
        char err[512] = "";
        if (config_set(c, s->key, s->value, err, sizeof err) == 0) continue;
        size_t n = strlen(s->key);
        if (strncmp(err, s->key, n) == 0 && err[n] == ':')
            diag_error(L->d, (Loc){0}, "--%s", err);  // "--precision: unknown value ..."
        else
            diag_error(L->d, (Loc){0}, "--%s: %s", s->key, err[0] ? err : "bad setting");
    }
}
