/* frontend/lower.h: what the lowering files share (private to the frontend).
 *
 *   lower.c      fe_compile: parse, settings, the model's declarations, loss and outputs
 *   settings.c   the `train` block and the command line's --key value over the defaults;
 *                freeze and weight_decay_on on the params
 *   expr.c       statements and expressions: op calls, layer instances
 *   index.c      indexing and slicing, x[:, 0, :]
 *   consteval.c  constant expressions: dims, shapes, attributes, initializers
 *   scope.c      names in scope, and the errors for names that are not
 *
 * Invariants: every allocation here comes from Lower.tmp (freed when fe_compile returns)
 * or from the Graph's arena (names the graph keeps). An error is reported once, where it
 * happens; what it poisons (a name, a value) is then used silently, so one mistake never
 * cascades into more messages.
 */
#ifndef FS_LOWER_H
#define FS_LOWER_H

#include "ast.h"
#include "frontend.h"

enum {
    LOWER_MAX_DEPTH = 1000,       // expression nesting
    LOWER_MAX_INSTANCES = 4096,   // Layer[N]
    LOWER_MAX_LIST = 64,          // items of an ints attribute
    LOWER_MAX_ITEMS = 1 << 21,    // nodes + values in one model: bounds memory on any input
};
#define LOWER_MAX_NUMEL ((int64_t)1 << 48)  // elements in one tensor

typedef enum { B_DIM, B_INPUT, B_PARAM, B_VALUE } BindKind;

typedef struct {
    const char *name;
    BindKind kind;
    int poisoned;  // its definition failed: uses are silent errors
    int64_t dim;   // B_DIM
    int value;     // B_INPUT, B_PARAM, B_VALUE: value id
    Loc loc;       // where it was declared or last assigned
} Binding;

/* Names visible to a statement. A layer instance's scope falls back to the model's
 * scope for dims only: a layer sees its params, the dims and its arguments. */
typedef struct Scope {
    Binding *b;
    int n, cap;
    const struct Scope *dims_from;
} Scope;

/* A layer definition, checked once when collected. */
typedef struct {
    const Stmt *def;
    int n_args;     // forward(args)
    int n_ret;      // values its return gives
    const Stmt *ret;  // its return statement
    int ok;         // structurally sound; instances of a broken layer are silently poison
} Layer;

/* A group of instances, `Layer[N](...) as NAME`: NAME.0 ... NAME.{N-1}. Calling NAME (or
 * one of them, NAME.i) again applies the same instances: their blocks and params. */
typedef struct {
    const char *name;  // `as NAME`, or "h"
    Loc loc;
    const Layer *layer;  // NULL until its instances are made (or when making them failed)
    int first_block, count;  // its instances' blocks: first_block + i for NAME.i
    int *params;       // [count][n_params]: each instance's params, in the layer's order (-1: failed)
    int n_params;
    int *uses;         // [count]: applications of each instance so far
} InstName;

typedef struct {
    Graph *g;
    Arena *tmp;
    Diag *d;
    const FrontendOptions *opt;
    const Stmt *body;       // the model's statements
    Scope model;
    Layer *layers;
    int n_layers;
    InstName *insts;
    int n_insts, cap_insts;
    const Layer *in_layer;  // the layer whose forward is being lowered, or NULL
    const char *prefix;     // the names of values made in that forward start with it: "h.3" ("s.0#2": a
                            // shared instance's second application), NULL at model level
    int use;                // that forward's application of its instance (Node.use), 0 for the first
    int block;              // Graph.blocks id for new nodes, -1 at model level
    int depth;              // expression nesting, against LOWER_MAX_DEPTH
    int deep_reported;
    int big_reported;       // LOWER_MAX_ITEMS was reached
    const char *batch_dim;  // the dim each data-parallel rank takes a part of, or NULL
    int64_t batch_split;    // into how many parts: world x microbatches
    int64_t world, microbatches;  // the two factors of batch_split, for its message
    int rng;                // the step's RNG words dropout reads (an input, SR_RNG), or -1
    int n_dropouts;         // dropouts lowered so far: the next one's key
} Lower;

/* The value of an expression. */
typedef enum { RV_POISON, RV_VALUE, RV_CONST, RV_TUPLE } RvKind;
typedef struct {
    RvKind kind;
    int id;            // RV_VALUE
    double c;          // RV_CONST: a number not yet made a tensor
    int n, *ids;       // RV_TUPLE
    const char *what;  // RV_TUPLE: what made it ("split", "Block"), for messages
} RVal;

/* ---- scope.c ----------------------------------------------------------------------- */
void scope_init(Scope *s, const Scope *dims_from);
/* Searches s, then dims_from for dims. NULL when unbound. */
const Binding *scope_find(const Scope *s, const char *name);
/* Binds (or rebinds) name in s itself. */
Binding *scope_bind(Lower *L, Scope *s, const char *name, BindKind kind, Loc loc);
const Layer *lower_layer_find(const Lower *L, const char *name);
/* The model-level dim, input, param or layer statement declaring name, or NULL. */
const Stmt *lower_decl_find(const Lower *L, const char *name);
int lower_is_init_name(const char *name);
/* Reports `name` at loc as unknown, with what it is instead or the closest name. */
void lower_unknown(Lower *L, const Scope *s, const char *name, Loc loc, int callable);
const char *bind_kind_name(BindKind k);

/* ---- consteval.c: 0 on success, -1 after an error (reported, or a poisoned name) --- */
/* `what` names the thing evaluated, for messages: "dim 'B'", "split: argument 'n'". */
int ce_int(Lower *L, const Scope *s, const Expr *e, const char *what, int64_t *out);
int ce_float(Lower *L, const Scope *s, const Expr *e, const char *what, double *out);
/* A list of dim expressions; every dim > 0, at most IR_MAX_RANK, at most
 * LOWER_MAX_NUMEL elements. `what` is "'x'". */
int ce_shape(Lower *L, const Scope *s, const Expr *dims, const char *what, Loc loc, Value *v);
/* A param's initializer into v->init, init_a, init_b. */
int ce_init(Lower *L, const Scope *s, const Expr *init, Value *v);
/* Elements of v, or -1 when more than LOWER_MAX_NUMEL. */
int64_t ce_numel(const Value *v);

/* Counts one level of expression nesting (the caller decrements L->depth after);
 * -1, with one error per compilation, past LOWER_MAX_DEPTH. */
int lower_enter(Lower *L, Loc loc);

/* ---- expr.c ------------------------------------------------------------------------ */
/* 1, with one error per compilation, when the graph has grown past LOWER_MAX_ITEMS. */
int lower_too_big(Lower *L, Loc loc);
RVal lower_expr(Lower *L, Scope *s, const Expr *e);
/* `a, b = expr;` binds the targets in s; to poison when anything in it failed. */
void lower_assign(Lower *L, Scope *s, const Stmt *st);
/* A node in the current block, its one result (or a tuple); poison after its error. */
RVal lower_add_node(Lower *L, OpKind op, const int *in, int n_in, const Attr *attrs, int n_attr, Loc loc);
/* The one tensor r stands for (a constant made a scalar), or -1 (after an error for a tuple). */
int lower_one_value(Lower *L, RVal r, Loc loc);
/* Whether value x depends on a batch input (the model's inputs: their first dim is the batch). */
int lower_from_batch(Lower *L, int x);

/* A tuple of n values made by `what`. */
RVal lower_tuple(Lower *L, const int *ids, int n, const char *what);

/* ---- instance.c --------------------------------------------------------------------- */
/* Layer(args), Layer[N](args) [as NAME]: new instances, each a block of its own. */
RVal lower_instances(Lower *L, Scope *s, const Expr *e, const Layer *ly);
/* The group named `name` (NAME, from `as NAME`), or one of its instances (NAME.i): first
 * and n its instances; NULL when no group has that name. */
InstName *lower_group_find(Lower *L, const char *name, int *first, int *n);
/* NAME(args), NAME[N](args): the group's instances applied again (N times over). */
RVal lower_reuse(Lower *L, Scope *s, const Expr *e, InstName *grp, int first, int n);

/* ---- index.c ------------------------------------------------------------------------ */
/* x[items]: slices of the dims not kept whole, then a reshape without the indexed ones. */
RVal lower_index(Lower *L, Scope *s, const Expr *e);

/* ---- lower.c: declarations, shared by the model and layer instances ---------------- */
/* Evaluates `dim N = expr` (or takes def's value) and binds N in s. */
void lower_dim(Lower *L, Scope *s, const Stmt *st, const Define *def);
/* Adds the param declared by st, named `full`, to the graph; its value id or -1. */
int lower_param(Lower *L, Scope *s, const Stmt *st, const char *full, int block);

/* ---- settings.c --------------------------------------------------------------------- */
void lower_settings(Lower *L, const Program *p, TrainConfig *train);
/* After the params are made: `freeze` and `weight_decay_on matrices` mark them (frozen,
 * no_decay); a name that matches no param is an error, and so is a model with nothing
 * left to train. */
void lower_param_groups(Lower *L, const Program *p, const TrainConfig *train);
/* Checks each `recompute` item against the blocks made (errors at the train block's item,
 * or for the command line's --recompute). */
void lower_recompute_check(Lower *L, const Program *p, const TrainConfig *train);

#endif
