/* frontend/parser.y: the .fsm grammar (bison, pure, with locations).
 *
 * Actions are one-line calls to constructors: ast.c's, or the small ones below that
 * fill an ast.c node's fields. A node's Loc is its first token's (the operator's for a
 * binary expression), as YYLLOC_DEFAULT gives it. Statements are parsed with one
 * grammar everywhere; which kinds a model, a layer or a forward block may hold is
 * checked apart (check_place), so a misplaced `return` gets a message that says so
 * rather than a bare syntax error. Once parsed, the tree is well formed: lower.c need
 * not recheck where statements appear.
 *
 * Errors: messages are built in yyreport_syntax_error from the expected tokens (LAC
 * makes that list exact). Recovery resynchronizes at ';' and at a block's '}', so one
 * run reports several errors; it stops when the Diag has stopped collecting.
 *
 * Where it sits: lexer.l -> parser.y -> Program (ast.h) -> lower.c.
 */

%code requires {
#include <setjmp.h>
#include "ast.h"

#ifndef YY_TYPEDEF_YY_SCANNER_T
#define YY_TYPEDEF_YY_SCANNER_T
typedef void *yyscan_t;
#endif

/* A statement longer than this is an error. It bounds the depth of any tree the parser
 * makes, so the recursive walks after it (lowering, printing) cannot overflow the
 * stack on a pathological `a + a + a + ...`, and the length of any list in it. */
enum { FE_MAX_STMT_TOKENS = 10000 };

/* What the scanner and the parser share over one parse; the scanner's yyextra. */
typedef struct ParseCtx {
    Arena *arena;
    Diag *diag;
    Program *prog;        // set when `model NAME { ... }` has been parsed
    int line, col;        // the scanner's position: where the next byte is
    Loc tok;              // the last token scanned (the parser's lookahead at an error)
    const char *tok_text; // its text as written; NULL at end of input
    Loc last_end;         // just past the last token; where end of input is reported
    Loc prev_end;         // just past the token before it
    int n_tokens;         // tokens since the last statement; at most FE_MAX_STMT_TOKENS
    struct {
        const Stmt *list;
        Stmt *tail;
    } tails[4];           // stmt_append's memory of the lists it is building
    jmp_buf *fatal;       // where the scanner's fatal errors jump; NULL: abort
} ParseCtx;

/* The scanner state, for fe_parse and the lexer test. */
void fe_ctx_init(ParseCtx *c, Arena *a, Diag *d);
}

%code {
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "lexer.h"

/* A node's location is its first token's; an empty rule sits just past the last one. */
#define YYLLOC_DEFAULT(Cur, Rhs, N)                                                     \
    do {                                                                                \
        if (N) (Cur) = YYRHSLOC(Rhs, 1);                                                \
        else (Cur) = (Loc){YYRHSLOC(Rhs, 0).line, YYRHSLOC(Rhs, 0).col + YYRHSLOC(Rhs, 0).len, 0};\
    } while (0)

/* After `error ';'` or `error '}'`: report the next error at once, unless the Diag has
 * given up, in which case so does the parser. */
#define RECOVER()                                                                       \
    do {                                                                                \
        if (c->diag->stopped) YYABORT;                                                  \
        c->n_tokens = 0;                                                                \
        yyerrok;                                                                        \
    } while (0)

static void yyerror(const Loc *loc, yyscan_t scanner, ParseCtx *c, const char *msg);
static Stmt *stmt_append(ParseCtx *c, Stmt *list, Stmt *s);

static Expr *mk_num(ParseCtx *c, const char *text, Loc loc);
static Expr *mk_str(ParseCtx *c, const char *text, Loc loc);
static Expr *mk_name(ParseCtx *c, const char *name, Loc loc);
static Expr *mk_neg(ParseCtx *c, Expr *e, Loc loc);
static Expr *mk_binary(ParseCtx *c, int op, Expr *l, Expr *r, Loc loc);
static Expr *mk_call(ParseCtx *c, const char *name, Loc loc, Arg *args);
static Expr *mk_inst(ParseCtx *c, const char *name, Loc loc, Expr *count, Arg *args, Name *as);
static Expr *mk_list(ParseCtx *c, Loc loc, Expr *items);
static Expr *mk_index(ParseCtx *c, Expr *base, Expr *items, Loc loc);
static Expr *mk_slice(ParseCtx *c, Expr *start, Expr *stop, Loc loc);
static Expr *inst_count(ParseCtx *c, Expr *items);
static Stmt *mk_dim(ParseCtx *c, const char *name, Loc loc, Expr *value);
static Stmt *mk_tensor(ParseCtx *c, StmtKind kind, Loc loc, const char *name, Loc name_loc,
                       const char *dtype, Loc dtype_loc, Expr *shape, Expr *init);
/* A param's flags: each known, each once. */
static Name *check_flags(ParseCtx *c, Name *flags)
{
    static const char *const known[] = {"frozen", "no_decay"};
    for (const Name *f = flags; f; f = f->next) {
        const char *near = diag_closest(f->name, known, 2);
        if (strcmp(f->name, known[0]) && strcmp(f->name, known[1]))
            diag_error(c->diag, f->loc, "unknown param flag '%s'%s%s%s (expected frozen or no_decay)", f->name,
                       near ? "; did you mean '" : "", near ? near : "", near ? "'?" : "");
        for (const Name *g = flags; g != f; g = g->next)
            if (!strcmp(g->name, f->name)) diag_error(c->diag, f->loc, "param flag '%s' given twice", f->name);
    }
    return flags;
}

static Stmt *mk_assign(ParseCtx *c, Name *targets, Expr *value);
static Stmt *mk_return(ParseCtx *c, Loc loc, Expr *values);
static Stmt *mk_output(ParseCtx *c, Loc loc, Name *names);
static Stmt *layer_add(ParseCtx *c, Stmt *layer, Stmt *s);
static Stmt *mk_forward(ParseCtx *c, Stmt *layer, Loc loc, Name *args, Stmt *body);
static Stmt *mk_layer(ParseCtx *c, Stmt *layer, Loc loc, const char *name, Loc name_loc);
static Stmt *mk_setting(ParseCtx *c, const char *key, Loc loc, Expr *values, Arg *args);
static void mk_program(ParseCtx *c, const char *name, Loc loc, Stmt *body);
static void mk_train(ParseCtx *c, Loc loc, Stmt *settings);
}

%define api.pure full
%define api.location.type {Loc}
%define api.token.prefix {T_}
%define parse.error custom
%define parse.lac full
%locations
%param {yyscan_t scanner}
%parse-param {ParseCtx *c}
%initial-action { @$ = (Loc){1, 1, 0}; }

%union {
    const char *str;
    Expr *expr;
    Arg *arg;
    Name *name;
    Stmt *stmt;
}

%token YYEOF 0 "end of input"
%token <str> NAME "name" NUM "number" STRING "string"
%token <str> MODEL "'model'" TRAIN "'train'" LAYER "'layer'" FORWARD "'forward'"
%token <str> RETURN "'return'" DIM "'dim'" INPUT "'input'" PARAM "'param'"
%token <str> OUTPUT "'output'" AS "'as'"
%token POW "'**'"

%type <expr> expr primary exprs exprs_opt value values indexed indices index
%type <arg> args args_opt arg kwargs kwargs_opt kwarg
%type <name> targets names names_opt as_opt flags
%type <stmt> stmts body stmt dims dim layer_body layer_items settings setting
%type <str> dtype_opt ident

%left '+' '-'
%left '*' '/' '@'
%precedence NEG
%right POW          /* above unary minus, as Python: -x ** 2 is -(x ** 2), 2 ** -1 works */

%%

program
    : model train_opt
    ;

/* `error body` and the like: a broken header (`model {`, `layer B(x) {`) skips to its
 * block, which is then parsed as usual, rather than closing the block around it. */
model
    : MODEL ident body                          { mk_program(c, $2, @1, $3); }
    | MODEL error body                          { mk_program(c, NULL, @1, $3); }
    ;

/* After a stray '}' has closed the model early, the train block is still checked. */
train_opt
    : %empty
    | train
    | error train
    ;

train
    : TRAIN '{' settings '}'                    { mk_train(c, @1, $3); }
    | TRAIN '{' settings error '}'              { mk_train(c, @1, $3); RECOVER(); }
    ;

/* ---- statements ---------------------------------------------------------------- */

body
    : '{' stmts '}'                             { $$ = $2; }
    | '{' stmts error '}'                       { $$ = $2; RECOVER(); }
    ;

stmts
    : %empty                                    { $$ = NULL; }
    | stmts stmt                                { $$ = stmt_append(c, $1, $2); }
    | stmts error ';'                           { $$ = $1; RECOVER(); }
    ;

stmt
    : DIM dims ';'                              { $$ = $2; }
    | INPUT ident ':' ident '[' exprs_opt ']' ';'
                                                { $$ = mk_tensor(c, ST_INPUT, @1, $2, @2, $4, @4, $6, NULL); }
    | PARAM ident ':' dtype_opt '[' exprs_opt ']' '=' expr flags ';'
                                                { $$ = mk_tensor(c, ST_PARAM, @1, $2, @2, $4, @4, $6, $9);
                                                  $$->targets = check_flags(c, $10); }
    | targets '=' expr ';'                      { $$ = mk_assign(c, $1, $3); }
    | RETURN exprs ';'                          { $$ = mk_return(c, @1, $2); }
    | OUTPUT names ';'                          { $$ = mk_output(c, @1, $2); }
    | LAYER ident layer_body                    { $$ = mk_layer(c, $3, @1, $2, @2); }
    | LAYER error layer_body                    { $$ = mk_layer(c, $3, @1, NULL, @1); }
    ;

dims
    : dim                                       { $$ = $1; }
    | dims ',' dim                              { $$ = stmt_append(c, $1, $3); }
    ;

dim
    : ident '=' expr                            { $$ = mk_dim(c, $1, @1, $3); }
    ;

dtype_opt
    : %empty                                    { $$ = NULL; }
    | ident                                     { $$ = $1; }
    ;

/* Keywords are reserved only where they start something: `param output: ...` and
 * `forward(input)` use them as names; only a statement or a setting cannot start with
 * one used as a name. */
ident
    : NAME | MODEL | TRAIN | LAYER | FORWARD | RETURN | DIM | INPUT | PARAM | OUTPUT | AS
    ;

layer_body
    : '{' layer_items '}'                       { $$ = $2; }
    | '{' layer_items error '}'                 { $$ = $2; RECOVER(); }
    ;

/* The layer under construction (an ST_LAYER) collects its params and its forward. */
layer_items
    : %empty                                    { $$ = ast_stmt(c->arena, ST_LAYER, @$); }
    | layer_items stmt                          { $$ = layer_add(c, $1, $2); }
    | layer_items FORWARD '(' names_opt ')' body { $$ = mk_forward(c, $1, @2, $4, $6); }
    | layer_items FORWARD error body            { $$ = mk_forward(c, $1, @2, NULL, $4); }
    | layer_items error ';'                     { $$ = $1; RECOVER(); }
    ;

/* An assignment starts with a plain name: one that is a keyword starts its statement. */
targets
    : NAME                                      { $$ = ast_name(c->arena, $1, @1); }
    | targets ',' ident                         { $$ = ast_name_append($1, ast_name(c->arena, $3, @3)); }
    ;

names
    : ident                                     { $$ = ast_name(c->arena, $1, @1); }
    | names ',' ident                           { $$ = ast_name_append($1, ast_name(c->arena, $3, @3)); }
    ;

names_opt
    : %empty                                    { $$ = NULL; }
    | names                                     { $$ = $1; }
    ;

/* A param's flags after its initializer: `= zeros frozen`, `= ones no_decay`. */
flags
    : %empty                                    { $$ = NULL; }
    | flags NAME                                { $$ = ast_name_append($1, ast_name(c->arena, $2, @2)); }
    ;

/* ---- expressions --------------------------------------------------------------- */

expr
    : expr '+' expr                             { $$ = mk_binary(c, '+', $1, $3, @2); }
    | expr '-' expr                             { $$ = mk_binary(c, '-', $1, $3, @2); }
    | expr '*' expr                             { $$ = mk_binary(c, '*', $1, $3, @2); }
    | expr '/' expr                             { $$ = mk_binary(c, '/', $1, $3, @2); }
    | expr '@' expr                             { $$ = mk_binary(c, '@', $1, $3, @2); }
    | expr POW expr                             { $$ = mk_binary(c, '^', $1, $3, @2); }
    | '-' expr %prec NEG                        { $$ = mk_neg(c, $2, @1); }
    | primary                                   { $$ = $1; }
    ;

primary
    : NUM                                       { $$ = mk_num(c, $1, @1); }
    | ident                                     { $$ = mk_name(c, $1, @1); }
    | ident '(' args_opt ')'                    { $$ = mk_call(c, $1, @1, $3); }
    | ident '(' args_opt ')' AS ident           { $$ = mk_inst(c, $1, @1, NULL, $3, ast_name(c->arena, $6, @6)); }
    | ident '[' indices ']' '(' args_opt ')' as_opt { $$ = mk_inst(c, $1, @1, inst_count(c, $3), $6, $8); }
    | '[' exprs_opt ']'                         { $$ = mk_list(c, @1, $2); }
    | '(' expr ')'                              { $$ = $2; }
    | indexed                                   { $$ = $1; }
    ;

/* Indexing, `x[:, 0, :]`, `f(x)[1:]`, `x[0][1:]`: a name, a call, a parenthesized
 * expression or an indexed one, then '['. `Layer[N](...)` shares the prefix up to ']';
 * the '(' after it makes it an instance (whose count is one plain index). Its Loc is the
 * '['. */
indexed
    : ident '[' indices ']'                     { $$ = mk_index(c, mk_name(c, $1, @1), $3, @2); }
    | ident '(' args_opt ')' '[' indices ']'    { $$ = mk_index(c, mk_call(c, $1, @1, $3), $6, @5); }
    | '(' expr ')' '[' indices ']'              { $$ = mk_index(c, $2, $5, @4); }
    | indexed '[' indices ']'                   { $$ = mk_index(c, $1, $3, @2); }
    ;

indices
    : index                                     { $$ = $1; }
    | indices ',' index                         { $$ = ast_expr_append($1, $3); }
    ;

/* An integer (the dim is dropped) or a slice start:stop, either side optional. */
index
    : expr                                      { $$ = $1; }
    | ':'                                       { $$ = mk_slice(c, NULL, NULL, @1); }
    | expr ':'                                  { $$ = mk_slice(c, $1, NULL, @2); }
    | ':' expr                                  { $$ = mk_slice(c, NULL, $2, @1); }
    | expr ':' expr                             { $$ = mk_slice(c, $1, $3, @2); }
    ;

as_opt
    : %empty                                    { $$ = NULL; }
    | AS ident                                  { $$ = ast_name(c->arena, $2, @2); }
    ;

exprs
    : expr                                      { $$ = $1; }
    | exprs ',' expr                            { $$ = ast_expr_append($1, $3); }
    ;

exprs_opt
    : %empty                                    { $$ = NULL; }
    | exprs                                     { $$ = $1; }
    ;

args
    : arg                                       { $$ = $1; }
    | args ',' arg                              { $$ = ast_arg_append($1, $3); }
    ;

args_opt
    : %empty                                    { $$ = NULL; }
    | args                                      { $$ = $1; }
    ;

arg
    : expr                                      { $$ = ast_arg(c->arena, NULL, (Loc){0, 0, 0}, $1); }
    | ident '=' expr                            { $$ = ast_arg(c->arena, $1, @1, $3); }
    ;

/* ---- the train block: `KEY v1, v2;`  `KEY NAME(k = v);`  `NAME(k = v);` ---------- */

settings
    : %empty                                    { $$ = NULL; }
    | settings setting                          { $$ = stmt_append(c, $1, $2); }
    | settings error ';'                        { $$ = $1; RECOVER(); }
    ;

setting
    : NAME values ';'                           { $$ = mk_setting(c, $1, @1, $2, NULL); }
    | NAME ident '(' kwargs_opt ')' ';'         { $$ = mk_setting(c, $1, @1, mk_name(c, $2, @2), $4); }
    | NAME '(' kwargs_opt ')' ';'               { $$ = mk_setting(c, $1, @1, NULL, $3); }
    ;

values
    : value                                     { $$ = $1; }
    | values ',' value                          { $$ = ast_expr_append($1, $3); }
    ;

/* Setting values are plain words and numbers, so `KEY NAME(...)` cannot be a call. */
value
    : NUM                                       { $$ = mk_num(c, $1, @1); }
    | '-' NUM                                   { $$ = mk_neg(c, mk_num(c, $2, @2), @1); }
    | ident                                     { $$ = mk_name(c, $1, @1); }
    | STRING                                    { $$ = mk_str(c, $1, @1); }
    ;

kwargs
    : kwarg                                     { $$ = $1; }
    | kwargs ',' kwarg                          { $$ = ast_arg_append($1, $3); }
    ;

kwargs_opt
    : %empty                                    { $$ = NULL; }
    | kwargs                                    { $$ = $1; }
    ;

kwarg
    : ident '=' value                           { $$ = ast_arg(c->arena, $1, @1, $3); }
    ;

%%

/* ---- node constructors: each fills one ast.c node ------------------------------ */

static Expr *new_expr(ParseCtx *c, ExprKind kind, Loc loc) { return ast_expr(c->arena, kind, loc); }

/* A statement is complete: the scanner's count of its tokens starts again. */
static Stmt *new_stmt(ParseCtx *c, StmtKind kind, Loc loc)
{
    c->n_tokens = 0;
    return ast_stmt(c->arena, kind, loc);
}

/* ast_stmt_append walks from the head, which would make a long block quadratic. This
 * remembers the tails of the few lists being built (they nest: model, layer, forward),
 * most recently used first, and has ast_stmt_append walk from there. */
static Stmt *stmt_append(ParseCtx *c, Stmt *list, Stmt *s)
{
    int n = (int)(sizeof c->tails / sizeof c->tails[0]), i = 0;
    while (i < n - 1 && c->tails[i].list != list) i++;
    Stmt *from = list && c->tails[i].list == list ? c->tails[i].tail : list;
    Stmt *head = list ? list : s;
    ast_stmt_append(from, s);
    memmove(&c->tails[1], &c->tails[0], (size_t)i * sizeof c->tails[0]);
    c->tails[0].list = head;
    c->tails[0].tail = s;
    return head;
}

static Expr *mk_num(ParseCtx *c, const char *text, Loc loc)
{
    Expr *e = new_expr(c, EX_NUM, loc);
    e->num = strtod(text, NULL);
    e->text = text;
    e->is_int = !strpbrk(text, ".eE");
    if (isinf(e->num)) diag_error(c->diag, loc, "number '%s' is out of range", text);
    return e;
}

static Expr *mk_str(ParseCtx *c, const char *text, Loc loc)
{
    Expr *e = new_expr(c, EX_STR, loc);
    e->text = text;
    return e;
}

static Expr *mk_name(ParseCtx *c, const char *name, Loc loc)
{
    Expr *e = new_expr(c, EX_NAME, loc);
    e->name = name;
    return e;
}

static Expr *mk_neg(ParseCtx *c, Expr *x, Loc loc)
{
    Expr *e = new_expr(c, EX_NEG, loc);
    e->lhs = x;
    return e;
}

static Expr *mk_binary(ParseCtx *c, int op, Expr *l, Expr *r, Loc loc)
{
    Expr *e = new_expr(c, EX_BINARY, loc);
    e->op = op;
    e->lhs = l;
    e->rhs = r;
    return e;
}

static Expr *mk_call(ParseCtx *c, const char *name, Loc loc, Arg *args)
{
    Expr *e = new_expr(c, EX_CALL, loc);
    e->name = name;
    e->args = args;
    return e;
}

static Expr *mk_inst(ParseCtx *c, const char *name, Loc loc, Expr *count, Arg *args, Name *as)
{
    Expr *e = mk_call(c, name, loc, args);
    e->kind = EX_INST;
    e->count = count;
    if (as) e->as_name = as->name, e->as_loc = as->loc;
    return e;
}

static Expr *mk_list(ParseCtx *c, Loc loc, Expr *items)
{
    Expr *e = new_expr(c, EX_LIST, loc);
    e->items = items;
    return e;
}

static Expr *mk_index(ParseCtx *c, Expr *base, Expr *items, Loc loc)
{
    Expr *e = new_expr(c, EX_INDEX, loc);
    e->lhs = base;
    e->items = items;
    return e;
}

/* A slice's Loc is its ':'. */
static Expr *mk_slice(ParseCtx *c, Expr *start, Expr *stop, Loc loc)
{
    Expr *e = new_expr(c, EX_SLICE, loc);
    e->lhs = start;
    e->rhs = stop;
    return e;
}

/* The N of `Layer[N](...)`: one index that is not a slice. */
static Expr *inst_count(ParseCtx *c, Expr *items)
{
    if (items->kind == EX_SLICE || items->next) {
        const Expr *at = items->kind == EX_SLICE ? items : items->next;
        diag_error(c->diag, at->loc, "the count of Layer[N](...) is one integer, not %s",
                   items->kind == EX_SLICE ? "a slice" : "several");
    }
    return items;
}

/* One Stmt per `N = expr` of a `dim` statement; its loc is the name's. */
static Stmt *mk_dim(ParseCtx *c, const char *name, Loc loc, Expr *value)
{
    Stmt *s = new_stmt(c, ST_DIM, loc);
    s->name = name;
    s->name_loc = loc;
    s->value = value;
    return s;
}

/* `input NAME: DTYPE[shape];` and `param NAME: [DTYPE][shape] = init;` */
static Stmt *mk_tensor(ParseCtx *c, StmtKind kind, Loc loc, const char *name, Loc name_loc,
                       const char *dtype, Loc dtype_loc, Expr *shape, Expr *init)
{
    Stmt *s = new_stmt(c, kind, loc);
    s->name = name;
    s->name_loc = name_loc;
    s->dtype = dtype;
    s->dtype_loc = dtype ? dtype_loc : (Loc){0, 0, 0};
    s->shape = shape;
    s->value = init;
    return s;
}

static Stmt *mk_assign(ParseCtx *c, Name *targets, Expr *value)
{
    Stmt *s = new_stmt(c, ST_ASSIGN, targets->loc);
    s->targets = targets;
    s->value = value;
    return s;
}

static Stmt *mk_return(ParseCtx *c, Loc loc, Expr *values)
{
    Stmt *s = new_stmt(c, ST_RETURN, loc);
    s->value = values;
    return s;
}

static Stmt *mk_output(ParseCtx *c, Loc loc, Name *names)
{
    Stmt *s = new_stmt(c, ST_OUTPUT, loc);
    s->targets = names;
    return s;
}

static Stmt *mk_setting(ParseCtx *c, const char *key, Loc loc, Expr *values, Arg *args)
{
    Stmt *s = new_stmt(c, ST_SETTING, loc);
    s->name = key;
    s->name_loc = loc;
    s->value = values;
    s->args = args;
    return s;
}

/* ---- where statements may appear ------------------------------------------------ */

enum { IN_MODEL, IN_LAYER, IN_FORWARD };

#define BIT(kind) (1u << (kind))
static const unsigned allowed_in[] = {
    [IN_MODEL] = BIT(ST_DIM) | BIT(ST_INPUT) | BIT(ST_PARAM) | BIT(ST_ASSIGN) | BIT(ST_OUTPUT) | BIT(ST_LAYER),
    [IN_LAYER] = BIT(ST_DIM) | BIT(ST_PARAM),
    [IN_FORWARD] = BIT(ST_ASSIGN) | BIT(ST_RETURN),
};
static const char *const place_name[] = {
    [IN_MODEL] = "in the model body",
    [IN_LAYER] = "in a layer body (a layer holds 'param', 'dim' and 'forward')",
    [IN_FORWARD] = "in a forward block (it holds assignments and 'return')",
};
static const char *const stmt_what[] = {
    [ST_DIM] = "'dim'", [ST_INPUT] = "'input'", [ST_PARAM] = "'param'",
    [ST_ASSIGN] = "an assignment", [ST_RETURN] = "'return'", [ST_OUTPUT] = "'output'",
    [ST_LAYER] = "a layer definition", [ST_SETTING] = "a setting",
};

static void check_place(ParseCtx *c, const Stmt *list, int place)
{
    for (const Stmt *s = list; s; s = s->next) {
        if (allowed_in[place] & BIT(s->kind)) continue;
        if (s->kind == ST_RETURN)
            diag_error(c->diag, s->loc, "'return' is only allowed in a forward block");
        else
            diag_error(c->diag, s->loc, "%s is not allowed %s", stmt_what[s->kind], place_name[place]);
    }
}

/* A layer's params and dims are checked as they come, so messages stay in order. */
static Stmt *layer_add(ParseCtx *c, Stmt *layer, Stmt *s)
{
    check_place(c, s, IN_LAYER);
    layer->body = stmt_append(c, layer->body, s);
    return layer;
}

static Stmt *mk_forward(ParseCtx *c, Stmt *layer, Loc loc, Name *args, Stmt *body)
{
    if (layer->fwd_loc.line)
        diag_error(c->diag, loc, "a layer has one forward block; the first is at line %d",
                   layer->fwd_loc.line);
    check_place(c, body, IN_FORWARD);
    layer->targets = args;
    layer->fwd = body;
    layer->fwd_loc = loc;
    return layer;
}

/* `layer_items` built the node; this names and places it. */
static Stmt *mk_layer(ParseCtx *c, Stmt *layer, Loc loc, const char *name, Loc name_loc)
{
    layer->loc = loc;
    layer->name = name;
    layer->name_loc = name_loc;
    return layer;
}

static void mk_program(ParseCtx *c, const char *name, Loc loc, Stmt *body)
{
    check_place(c, body, IN_MODEL);
    Program *p = arena_alloc(c->arena, sizeof *p);
    p->name = name;
    p->loc = loc;
    p->body = body;
    c->prog = p;
}

static void mk_train(ParseCtx *c, Loc loc, Stmt *settings)
{
    if (!c->prog) return;
    c->prog->train = settings;
    c->prog->train_loc = loc;
}

/* ---- syntax error messages ------------------------------------------------------- */

enum { MAX_WORDS = 5 };

/* Replaces the tokens that start something in the expected set by one word for it
 * ("expression") when the `need` tokens are all there. Returns 1 if it did. */
static int take_class(char *want, const yysymbol_kind_t *need, int n_need,
                      const yysymbol_kind_t *more, int n_more)
{
    static const yysymbol_kind_t idents[] = {
        YYSYMBOL_NAME,   YYSYMBOL_MODEL, YYSYMBOL_TRAIN, YYSYMBOL_LAYER,  YYSYMBOL_FORWARD, YYSYMBOL_RETURN,
        YYSYMBOL_DIM,    YYSYMBOL_INPUT, YYSYMBOL_PARAM, YYSYMBOL_OUTPUT, YYSYMBOL_AS};
    for (int i = 0; i < n_need; i++)
        if (!want[need[i]]) return 0;
    for (int i = 0; i < n_more; i++) want[more[i]] = 0;
    for (size_t i = 0; i < sizeof idents / sizeof idents[0]; i++) want[idents[i]] = 0;
    return 1;
}

/* What the parser expected, as words: a class ("expression", "statement", "value",
 * "name") stands for the many tokens that start one (keywords among them, as they
 * double as names); operators and other tokens that would only continue what came
 * before are left out when something else remains, so that `x = a b` reads
 * "expected ';'" rather than a list of every operator. */
static int expected_words(const yypcontext_t *yc, const char **w, int *n_class)
{
    yysymbol_kind_t exp[YYNTOKENS];
    char want[YYNTOKENS] = {0};
    int n = yypcontext_expected_tokens(yc, exp, YYNTOKENS), m = 0;
    for (int i = 0; i < n; i++) want[exp[i]] = 1;

    const yysymbol_kind_t lp = YYTRANSLATE('('), lb = YYTRANSLATE('['), neg = YYTRANSLATE('-');
    const yysymbol_kind_t value_need[] = {YYSYMBOL_NUM, YYSYMBOL_STRING};
    const yysymbol_kind_t value_more[] = {YYSYMBOL_NUM, YYSYMBOL_STRING, neg};
    const yysymbol_kind_t expr_need[] = {YYSYMBOL_NUM, lp};
    const yysymbol_kind_t expr_more[] = {YYSYMBOL_NUM, lp, lb, neg};
    const yysymbol_kind_t stmt_need[] = {YYSYMBOL_DIM, YYSYMBOL_NAME};
    const yysymbol_kind_t name_need[] = {YYSYMBOL_NAME};
    /* A setting's value first: its NUM NAME '(' would otherwise read as an expression. */
    if (take_class(want, value_need, 2, value_more, 3)) w[m++] = "value";
    if (take_class(want, expr_need, 2, expr_more, 4)) w[m++] = "expression";
    /* Where a name may be any keyword, 'model' is among them; where a statement may
     * start, it is not. */
    if (!want[YYSYMBOL_MODEL] && take_class(want, stmt_need, 2, NULL, 0)) w[m++] = "statement";
    *n_class = m;  /* "name" reads like a token: "expected name before '{'" */
    if (take_class(want, name_need, 1, NULL, 0)) w[m++] = "name";

    const yysymbol_kind_t cont[] = {YYTRANSLATE('+'), YYTRANSLATE('-'), YYTRANSLATE('*'), YYTRANSLATE('/'),
                                    YYTRANSLATE('@'), YYSYMBOL_POW, lp, lb, YYSYMBOL_AS};
    char is_cont[YYNTOKENS] = {0};
    for (size_t i = 0; i < sizeof cont / sizeof *cont; i++) is_cont[cont[i]] = 1;
    int rest = m;
    for (int k = 0; k < YYNTOKENS; k++) rest += want[k] && !is_cont[k];
    for (int k = 0; k < YYNTOKENS && rest > 0; k++)
        if (is_cont[k]) want[k] = 0;
    /* In `f(a b)`, '=' would only make `a` a keyword. */
    if (want[YYTRANSLATE(')')]) want[YYTRANSLATE('=')] = 0;

    /* End of input reads best last: "'train' or end of input". */
    for (int k = YYSYMBOL_YYEOF + 1; k <= YYNTOKENS; k++) {
        yysymbol_kind_t kind = k == YYNTOKENS ? YYSYMBOL_YYEOF : (yysymbol_kind_t)k;
        if (!want[kind]) continue;
        if (m == MAX_WORDS) return MAX_WORDS + 1;
        w[m++] = yysymbol_name(kind);
    }
    return m;
}

/* The token the parser stopped at, as the user wrote it: 'x', 3, "str". */
static void show_token(const ParseCtx *c, yysymbol_kind_t k, char *buf, size_t size)
{
    if (k == YYSYMBOL_YYEOF || !c->tok_text) {
        snprintf(buf, size, "end of input");
        return;
    }
    const char *q = k == YYSYMBOL_STRING ? "" : "'";
    snprintf(buf, size, "%s%.40s%s%s", q, c->tok_text, strlen(c->tok_text) > 40 ? "..." : "", q);
    for (char *p = buf; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f) *p = '?';
}

static void join_words(const char **w, int n, char *buf, size_t size)
{
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < n && at < size; i++) {
        const char *sep = i == 0 ? "" : i == n - 1 ? " or " : ", ";
        at += (size_t)snprintf(buf + at, size - at, "%s%s", sep, w[i]);
    }
}

/* `expected ';' before 'x'` when one token would do, else `unexpected 'x', expected
 * expression or ')'`. A missing token is reported just past the token before the
 * lookahead when the lookahead sits on a later line, gcc style. */
static int yyreport_syntax_error(const yypcontext_t *yc, yyscan_t scanner, ParseCtx *c)
{
    (void)scanner;
    const char *w[MAX_WORDS + 1];
    char got[64], exp[256];
    int n_class = 0, n = expected_words(yc, w, &n_class);
    yysymbol_kind_t k = yypcontext_token(yc);
    int at_end = k == YYSYMBOL_YYEOF;
    Loc at = at_end ? c->last_end : c->tok;
    if (at.line == 0) at = (Loc){1, 1, 1};
    show_token(c, k, got, sizeof got);
    join_words(w, n > MAX_WORDS ? 0 : n, exp, sizeof exp);

    if (n == 1 && n_class == 0) {
        if (!at_end && c->prev_end.line && c->prev_end.line < c->tok.line) at = c->prev_end;
        diag_error(c->diag, at, "expected %s %s%s", exp, at_end ? "at " : "before ", got);
    } else if (n >= 1 && n <= MAX_WORDS) {
        diag_error(c->diag, at, "unexpected %s, expected %s", got, exp);
    } else {
        diag_error(c->diag, at, "unexpected %s", got);
    }
    return 0;
}

/* Bison's own messages: only "memory exhausted", when the parser's stack is full. */
static void yyerror(const Loc *loc, yyscan_t scanner, ParseCtx *c, const char *msg)
{
    (void)scanner;
    if (!strcmp(msg, "memory exhausted")) msg = "too deeply nested";
    diag_error(c->diag, *loc, "%s", msg);
}
