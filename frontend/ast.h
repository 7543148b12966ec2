/* frontend/ast.h: the syntax tree the parser builds and lower.c elaborates.
 *
 * A tree of plain structs in the compilation's Arena; lists are singly linked through
 * `next`. Every node carries the Loc of its first token (for a binary expression: of
 * the operator), which is where lower.c points its carets.
 *
 * Where it sits: lexer.l + parser.y -> Program -> lower.c -> Graph (ir/ir.h).
 */
#ifndef FS_AST_H
#define FS_AST_H

#include "ir.h"

typedef enum {
    EX_NUM,     // 3, 0.02, 6e-4: num, text, is_int
    EX_STR,     // "1f1b": text
    EX_NAME,    // x, ln1.w, h.3 (dotted names are one token): name
    EX_NEG,     // -lhs
    EX_BINARY,  // lhs op rhs, op one of '+' '-' '*' '/' '@', or '^' for lhs ** rhs
    EX_CALL,    // name(args): an op, an initializer, or a setting like adamw(...)
    EX_INST,    // name[count](args) as as_name: layer instances; count and as_name optional
    EX_LIST,    // [items]
    EX_INDEX,   // lhs[items]: x[:, 0, :], x[:, 1:]; each item an index expression or an EX_SLICE
    EX_SLICE,   // lhs:rhs inside an EX_INDEX, either side NULL when omitted (`:`, `1:`, `:-1`)
} ExprKind;

typedef struct Expr Expr;

/* One argument of a call: positional when key is NULL. */
typedef struct Arg {
    const char *key;
    Loc key_loc;
    Expr *value;
    struct Arg *next;
} Arg;

struct Expr {
    ExprKind kind;
    Loc loc;
    double num;
    int is_int;         // EX_NUM: written without '.', 'e' (an integer literal)
    const char *text;   // EX_NUM: as written; EX_STR: the contents, unquoted
    const char *name;   // EX_NAME, EX_CALL, EX_INST
    int op;             // EX_BINARY
    Expr *lhs, *rhs;    // EX_NEG uses lhs; EX_INDEX: lhs is what is indexed; EX_SLICE: start, stop
    Arg *args;          // EX_CALL, EX_INST
    Expr *count;        // EX_INST: the N of Layer[N](...), NULL for Layer(...)
    const char *as_name;  // EX_INST: `as h`, NULL when absent
    Loc as_loc;
    Expr *items;        // EX_LIST, EX_INDEX
    Expr *next;         // the next item of a list (EX_LIST items, return values, settings)
};

typedef struct Name {
    const char *name;
    Loc loc;
    struct Name *next;
} Name;

typedef enum {
    ST_DIM,      // dim B = 4, T = 64;  (one Stmt per dim): name, value
    ST_INPUT,    // input tokens: i32[B, T];  name, dtype, shape
    ST_PARAM,    // param attn.w: [C, 3*C] = normal(0.02);  name, dtype, shape, value (init),
                 //   targets (flags after the init: frozen, no_decay)
    ST_ASSIGN,   // x = expr;  q, k, v = split(...);  targets, value
    ST_RETURN,   // return x;  return a, b;  value (a list linked by next)
    ST_OUTPUT,   // output logits;  targets
    ST_LAYER,    // layer Block { params; forward(x) { body } }  name, body, targets (forward args), fwd
    ST_SETTING,  // in train { }: `precision bf16;` `world 8;` `recompute A, B;`
                 //   `optimizer adamw(lr = 6e-4);` `pipeline(stages = 2);`
                 //   name, value (a list linked by next; NULL for `pipeline(...)`), args
} StmtKind;

typedef struct Stmt {
    StmtKind kind;
    Loc loc;             // the statement's first token
    const char *name;
    Loc name_loc;
    const char *dtype;   // ST_INPUT, ST_PARAM: as written ("i32"), NULL when omitted
    Loc dtype_loc;
    Expr *shape;         // ST_INPUT, ST_PARAM: dim expressions linked by next
    Expr *value;
    Name *targets;
    struct Stmt *body;   // ST_LAYER: its params and dims
    struct Stmt *fwd;    // ST_LAYER: the forward body
    Loc fwd_loc;         // ST_LAYER: the `forward` keyword; line 0 when the layer has none
    Arg *args;           // ST_SETTING: keyword arguments of `pipeline(...)` or `adamw(...)`
    struct Stmt *next;
} Stmt;

typedef struct {
    const char *name;    // model name
    Loc loc;
    Stmt *body;          // the model block's statements
    Stmt *train;         // the train block's settings; NULL when absent
    Loc train_loc;
} Program;

/* ---- frontend/ast.c: constructors (all memory from the arena) -------------------- */
Expr *ast_expr(Arena *a, ExprKind kind, Loc loc);
Stmt *ast_stmt(Arena *a, StmtKind kind, Loc loc);
Arg *ast_arg(Arena *a, const char *key, Loc key_loc, Expr *value);
Name *ast_name(Arena *a, const char *name, Loc loc);
/* Appends to a NULL-terminated list through `next`; returns the head. */
Expr *ast_expr_append(Expr *list, Expr *e);
Stmt *ast_stmt_append(Stmt *list, Stmt *s);
Arg *ast_arg_append(Arg *list, Arg *a);
Name *ast_name_append(Name *list, Name *n);
/* Prints the tree as S-expressions, for parser tests. */
void ast_print(const Program *p, FILE *out);

/* ---- frontend/parse.c: the scanner and parser driven over one buffer ------------- */

/* Parses `src` (not necessarily NUL-terminated). Syntax errors go to `d` (several per
 * run: the parser resynchronizes at ';' and '}'); returns NULL if there were any. */
Program *fe_parse(const char *src, size_t len, Arena *a, Diag *d);

#endif
