/* frontend/ast_print.c: the syntax tree as S-expressions, one line per block.
 *
 * The format, stable because parser tests compare against it:
 *
 *   (model NAME STMT...)                   then, if present, on the next line
 *   (train SETTING...)
 *
 *   (dim N E)  (input N DTYPE (SHAPE...))  (param N [DTYPE] (SHAPE...) INIT)
 *   (assign (T...) E)  (return E...)  (output N...)
 *   (layer N STMT... [(forward (ARG...) STMT...)])
 *   (set KEY V... (K= V)...)               a train setting; `KEY NAME(k = v)` is
 *                                          (set KEY NAME (k= v)), `NAME(k = v)` (set NAME (k= v))
 *   expressions: 3  6e-4 (numbers as written)  "str"  x  ln1.w  (- E)  (+ A B)  (@ A B)
 *                (call F ARG...)  (list E...)  (inst L [COUNT] ARG... [(as N)])
 *                (index E ITEM...), a slice item (: START STOP) with `_` for an omitted side
 *                keyword arguments print as (key= E)
 *
 * A single space separates items. Locations are not printed; tests check them apart.
 */
#include "ast.h"

static void print_expr(const Expr *e, FILE *out);

static void print_args(const Arg *a, FILE *out)
{
    for (; a; a = a->next) {
        fputc(' ', out);
        if (a->key) fprintf(out, "(%s= ", a->key);
        print_expr(a->value, out);
        if (a->key) fputc(')', out);
    }
}

/* Items of an expression list, each preceded by a space. */
static void print_exprs(const Expr *e, FILE *out)
{
    for (; e; e = e->next) {
        fputc(' ', out);
        print_expr(e, out);
    }
}

static void print_names(const Name *n, FILE *out)
{
    for (const Name *p = n; p; p = p->next) fprintf(out, p == n ? "%s" : " %s", p->name);
}

static void print_expr(const Expr *e, FILE *out)
{
    switch (e->kind) {
    case EX_NUM: fputs(e->text, out); return;
    case EX_STR: fprintf(out, "\"%s\"", e->text); return;
    case EX_NAME: fputs(e->name, out); return;
    case EX_NEG: fputs("(- ", out); print_expr(e->lhs, out); fputc(')', out); return;
    case EX_BINARY:
        if (e->op == '^') fputs("(** ", out);
        else fprintf(out, "(%c ", e->op);
        print_expr(e->lhs, out);
        fputc(' ', out);
        print_expr(e->rhs, out);
        fputc(')', out);
        return;
    case EX_CALL: fprintf(out, "(call %s", e->name); print_args(e->args, out); fputc(')', out); return;
    case EX_LIST: fputs("(list", out); print_exprs(e->items, out); fputc(')', out); return;
    case EX_INDEX: fputs("(index ", out); print_expr(e->lhs, out); print_exprs(e->items, out); fputc(')', out); return;
    case EX_SLICE:
        fputs("(: ", out);
        e->lhs ? print_expr(e->lhs, out) : (void)fputc('_', out);
        fputc(' ', out);
        e->rhs ? print_expr(e->rhs, out) : (void)fputc('_', out);
        fputc(')', out);
        return;
    case EX_INST:
        fprintf(out, "(inst %s", e->name);
        if (e->count) fputs(" [", out), print_expr(e->count, out), fputc(']', out);
        print_args(e->args, out);
        if (e->as_name) fprintf(out, " (as %s)", e->as_name);
        fputc(')', out);
        return;
    }
}

static void print_stmts(const Stmt *s, FILE *out);

static void print_shape(const Expr *shape, FILE *out)
{
    fputs(" (", out);
    for (const Expr *e = shape; e; e = e->next) {
        if (e != shape) fputc(' ', out);
        print_expr(e, out);
    }
    fputc(')', out);
}

static void print_stmt(const Stmt *s, FILE *out)
{
    switch (s->kind) {
    case ST_DIM: fprintf(out, "(dim %s ", s->name); print_expr(s->value, out); break;
    case ST_INPUT: fprintf(out, "(input %s %s", s->name, s->dtype); print_shape(s->shape, out); break;
    case ST_PARAM:
        fprintf(out, "(param %s%s%s", s->name, s->dtype ? " " : "", s->dtype ? s->dtype : "");
        print_shape(s->shape, out);
        fputc(' ', out);
        print_expr(s->value, out);
        for (const Name *f = s->targets; f; f = f->next) fprintf(out, " %s", f->name);
        break;
    case ST_ASSIGN:
        fputs("(assign (", out);
        print_names(s->targets, out);
        fputs(") ", out);
        print_expr(s->value, out);
        break;
    case ST_RETURN: fputs("(return", out); print_exprs(s->value, out); break;
    case ST_OUTPUT: fputs("(output ", out); print_names(s->targets, out); break;
    case ST_LAYER:
        fprintf(out, "(layer %s", s->name);
        print_stmts(s->body, out);
        if (s->fwd_loc.line) {
            fputs(" (forward (", out);
            print_names(s->targets, out);
            fputc(')', out);
            print_stmts(s->fwd, out);
            fputc(')', out);
        }
        break;
    case ST_SETTING:
        fprintf(out, "(set %s", s->name);
        print_exprs(s->value, out);
        print_args(s->args, out);
        break;
    }
    fputc(')', out);
}

/* Statements of a block, each preceded by a space. */
static void print_stmts(const Stmt *s, FILE *out)
{
    for (; s; s = s->next) {
        fputc(' ', out);
        print_stmt(s, out);
    }
}

void ast_print(const Program *p, FILE *out)
{
    fprintf(out, "(model %s", p->name);
    print_stmts(p->body, out);
    fputs(")\n", out);
    if (!p->train_loc.line) return;
    fputs("(train", out);
    print_stmts(p->train, out);
    fputs(")\n", out);
}
