/* frontend/ast.c: constructors and a printer for the syntax tree (see ast.h). */
#include "ast.h"

Expr *ast_expr(Arena *a, ExprKind kind, Loc loc)
{
    Expr *e = arena_alloc(a, sizeof *e);
    e->kind = kind;
    e->loc = loc;
    return e;
}

Stmt *ast_stmt(Arena *a, StmtKind kind, Loc loc)
{
    Stmt *s = arena_alloc(a, sizeof *s);
    s->kind = kind;
    s->loc = loc;
    return s;
}

Arg *ast_arg(Arena *a, const char *key, Loc key_loc, Expr *value)
{
    Arg *g = arena_alloc(a, sizeof *g);
    g->key = key;
    g->key_loc = key_loc;
    g->value = value;
    return g;
}

Name *ast_name(Arena *a, const char *name, Loc loc)
{
    Name *n = arena_alloc(a, sizeof *n);
    n->name = name;
    n->loc = loc;
    return n;
}

#define APPEND(T, list, item)                                                            \
    do {                                                                                 \
        if (!(list)) return (item);                                                      \
        T *p_ = (list);                                                                  \
        while (p_->next) p_ = p_->next;                                                  \
        p_->next = (item);                                                               \
        return (list);                                                                   \
    } while (0)

Expr *ast_expr_append(Expr *list, Expr *e) { APPEND(Expr, list, e); }
Stmt *ast_stmt_append(Stmt *list, Stmt *s) { APPEND(Stmt, list, s); }
Arg *ast_arg_append(Arg *list, Arg *a) { APPEND(Arg, list, a); }
Name *ast_name_append(Name *list, Name *n) { APPEND(Name, list, n); }
