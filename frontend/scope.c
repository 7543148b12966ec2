/* frontend/scope.c: the names a statement can see, and the error for one it cannot.
 *
 * A scope is a small array searched from the end (models have tens of names, layers a
 * handful). Rebinding a name replaces its binding in place, so `x = x + 1` keeps one
 * entry. A layer instance's scope sees the model's dims through dims_from and nothing
 * else of the model.
 */
#include <string.h>

#include "lower.h"

void scope_init(Scope *s, const Scope *dims_from)
{
    memset(s, 0, sizeof *s);
    s->dims_from = dims_from;
}

static Binding *find_own(const Scope *s, const char *name)
{
    for (int i = s->n - 1; i >= 0; i--)
        if (strcmp(s->b[i].name, name) == 0) return &s->b[i];
    return NULL;
}

const Binding *scope_find(const Scope *s, const char *name)
{
    const Binding *b = find_own(s, name);
    if (b || !s->dims_from) return b;
    b = scope_find(s->dims_from, name);
    return b && b->kind == B_DIM ? b : NULL;
}

Binding *scope_bind(Lower *L, Scope *s, const char *name, BindKind kind, Loc loc)
{
    Binding *b = find_own(s, name);
    if (!b) {
        s->b = arena_grow(L->tmp, s->b, &s->cap, s->n + 1, sizeof *s->b);
        b = &s->b[s->n++];
    }
    memset(b, 0, sizeof *b);
    b->name = name;
    b->kind = kind;
    b->loc = loc;
    b->value = -1;
    return b;
}

const Layer *lower_layer_find(const Lower *L, const char *name)
{
    for (int i = 0; i < L->n_layers; i++)
        if (strcmp(L->layers[i].def->name, name) == 0) return &L->layers[i];
    return NULL;
}

const Stmt *lower_decl_find(const Lower *L, const char *name)
{
    for (const Stmt *st = L->body; st; st = st->next)
        if ((st->kind == ST_DIM || st->kind == ST_INPUT || st->kind == ST_PARAM ||
             st->kind == ST_LAYER) && strcmp(st->name, name) == 0)
            return st;
    return NULL;
}

static const char *const init_names[] = {"zeros", "ones", "normal", "uniform"};

int lower_is_init_name(const char *name)
{
    for (size_t i = 0; i < sizeof init_names / sizeof *init_names; i++)
        if (strcmp(init_names[i], name) == 0) return 1;
    return 0;
}

const char *bind_kind_name(BindKind k)
{
    static const char *const names[] = {"dim", "input", "param", "value"};
    return names[k];
}

static int op_callable(OpKind op) { return op != OP_COUNT && !(op_info(op)->flags & OPF_HIDDEN); }

/* Every name `s` sees, plus the callables when the name was called. */
static const char **candidates(Lower *L, const Scope *s, int callable, int *n)
{
    int cap = 0, k = 0;
    const char **c = NULL;
    for (const Scope *sc = s; sc; sc = sc->dims_from)
        for (int i = 0; i < sc->n; i++) {
            if (sc != s && sc->b[i].kind != B_DIM) continue;
            c = arena_grow(L->tmp, c, &cap, k + 1, sizeof *c);
            c[k++] = sc->b[i].name;
        }
    if (callable) {
        for (int op = 0; op < OP_COUNT; op++) {
            if (!op_callable((OpKind)op)) continue;
            c = arena_grow(L->tmp, c, &cap, k + 1, sizeof *c);
            c[k++] = op_name((OpKind)op);
        }
        for (int i = 0; i < L->n_layers && !L->in_layer; i++) {
            c = arena_grow(L->tmp, c, &cap, k + 1, sizeof *c);
            c[k++] = L->layers[i].def->name;
        }
    }
    *n = k;
    return c;
}

void lower_unknown(Lower *L, const Scope *s, const char *name, Loc loc, int callable)
{
    OpKind op = op_lookup(name);
    if (lower_is_init_name(name)) {
        diag_error(L->d, loc, "'%s' is an initializer; it can only start a param (param w: [C] = %s%s)",
                   name, name, strcmp(name, "normal") == 0 ? "(0.02)"
                                   : strcmp(name, "uniform") == 0 ? "(-0.1, 0.1)" : "");
        return;
    }
    if (!callable && op_callable(op)) {
        diag_error(L->d, loc, "'%s' is an op, not a value; call it as %s(...)", name, name);
        return;
    }
    if (!callable && lower_layer_find(L, name)) {
        diag_error(L->d, loc, "'%s' is a layer, not a value; instantiate it as %s(...)", name, name);
        return;
    }
    if (callable && scope_find(s, name)) {
        diag_error(L->d, loc, "'%s' is not an op or a layer (it is %s %s)", name,
                   scope_find(s, name)->kind == B_INPUT ? "an" : "a",
                   bind_kind_name(scope_find(s, name)->kind));
        return;
    }
    const char *what = callable ? "unknown op or layer" : "unknown name";
    const Binding *outer = L->in_layer ? scope_find(&L->model, name) : NULL;
    if (outer && outer->kind != B_DIM) {  // the model's: a suggestion would mislead
        diag_error(L->d, loc, "%s '%s' in the forward of '%s'", what, name, L->in_layer->def->name);
        diag_note(L->d, outer->loc,
                  "'%s' is the model's; a layer sees only its params, the dims and its "
                  "arguments: pass it as an argument", name);
        return;
    }
    int n;
    const char **c = candidates(L, s, callable, &n);
    const char *best = diag_closest(name, c, n);
    if (best)
        diag_error(L->d, loc, "%s '%s'; did you mean '%s'?", what, name, best);
    else
        diag_error(L->d, loc, "%s '%s'", what, name);
}
