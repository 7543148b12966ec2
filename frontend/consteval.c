/* frontend/consteval.c: expressions the compiler evaluates itself.
 *
 * Integers (dims, shapes, op attributes such as split's n, Layer[N]) are int64 with
 * every overflow caught and `/` exact; floats (initializer arguments, float attributes
 * such as eps) allow sqrt(). Both see numbers and dims, never tensors. Each error names
 * what was being evaluated ("dim 'D'", "split: argument 'n'") and points at the part of
 * the expression that is wrong.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lower.h"

int lower_enter(Lower *L, Loc loc)
{
    if (L->depth >= LOWER_MAX_DEPTH) {
        if (!L->deep_reported)
            diag_error(L->d, loc, "expression nested too deeply (more than %d levels)",
                       LOWER_MAX_DEPTH);
        L->deep_reported = 1;
        return -1;
    }
    L->depth++;
    return 0;
}

/* The dim `e` names, as an integer. */
static int dim_of(Lower *L, const Scope *s, const Expr *e, const char *what, int64_t *out)
{
    const Binding *b = scope_find(s, e->name);
    const Stmt *later = b ? NULL : lower_decl_find(L, e->name);
    if (later && later->kind == ST_DIM) {  // dims are evaluated in order
        diag_error(L->d, e->loc, "dim '%s' is used before its definition", e->name);
        diag_note(L->d, later->name_loc, "'%s' is defined here", e->name);
        return -1;
    }
    if (!b && !(later && (later->kind == ST_INPUT || later->kind == ST_PARAM))) {
        lower_unknown(L, s, e->name, e->loc, 0);
        return -1;
    }
    if (b && b->poisoned) return -1;
    if (!b || b->kind != B_DIM) {
        diag_error(L->d, e->loc, "%s must be a constant of numbers and dims, but '%s' is a tensor",
                   what, e->name);
        return -1;
    }
    *out = b->dim;
    return 0;
}

static int not_a_number(Lower *L, const Expr *e, const char *what, const char *kind)
{
    switch (e->kind) {
    case EX_LIST: diag_error(L->d, e->loc, "%s must be %s, not a list", what, kind); break;
    case EX_STR: diag_error(L->d, e->loc, "%s must be %s, not a string", what, kind); break;
    case EX_INST:
        diag_error(L->d, e->loc, "%s must be %s, not a layer instance", what, kind);
        break;
    case EX_BINARY:
        diag_error(L->d, e->loc, "%s must be %s; '@' multiplies tensors", what, kind);
        break;
    default: diag_error(L->d, e->loc, "%s must be %s", what, kind); break;
    }
    return -1;
}

static int int_literal(Lower *L, const Expr *e, const char *what, int64_t *out)
{
    if (!e->is_int) {
        diag_error(L->d, e->loc, "%s must be an integer, not %s", what,
                   e->text ? e->text : "a fraction");
        return -1;
    }
    if (!e->text) {
        if (!(e->num < 9.2e18)) goto range;
        *out = (int64_t)e->num;
        return 0;
    }
    errno = 0;
    char *end;
    long long v = strtoll(e->text, &end, 10);
    if (errno == ERANGE) goto range;
    *out = v;
    return 0;
range:
    diag_error(L->d, e->loc, "integer %s is too large", e->text ? e->text : "");
    return -1;
}

static int eval_int(Lower *L, const Scope *s, const Expr *e, const char *what, int64_t *out);

/* A binary operator as written: '^' stands for `**`. */
static const char *op_text(int op)
{
    return op == '^' ? "**" : op == '+' ? "+" : op == '-' ? "-" : op == '*' ? "*" : "/";
}

/* a ** b for b >= 0 by squaring; 1 when it overflows int64. */
static int int_pow(int64_t a, int64_t b, int64_t *out)
{
    int64_t r = 1;
    for (; b > 0; b >>= 1) {
        if ((b & 1) && __builtin_mul_overflow(r, a, &r)) return 1;
        if (b > 1 && __builtin_mul_overflow(a, a, &a)) return 1;
    }
    *out = r;
    return 0;
}

static int int_binary(Lower *L, const Scope *s, const Expr *e, const char *what, int64_t *out)
{
    if (e->op == '@') return not_a_number(L, e, what, "an integer");
    int64_t a, b;
    int ra = eval_int(L, s, e->lhs, what, &a);
    int rb = eval_int(L, s, e->rhs, what, &b);
    if (ra || rb) return -1;
    int over = 0;
    switch (e->op) {
    case '+': over = __builtin_add_overflow(a, b, out); break;
    case '-': over = __builtin_sub_overflow(a, b, out); break;
    case '*': over = __builtin_mul_overflow(a, b, out); break;
    case '^':
        if (b < 0 && a != 1) {
            diag_error(L->d, e->loc, "%s: %lld ** %lld is not a whole number", what, (long long)a, (long long)b);
            return -1;
        }
        over = b < 0 ? (*out = 1, 0) : int_pow(a, b, out);
        break;
    case '/':
        if (b == 0) {
            diag_error(L->d, e->loc, "%s: division by zero", what);
            return -1;
        }
        if ((a == INT64_MIN && b == -1) || a % b != 0) {
            diag_error(L->d, e->loc, "%s: %lld / %lld is not a whole number", what, (long long)a,
                       (long long)b);
            return -1;
        }
        *out = a / b;
        break;
    default: FS_ASSERT(!"binary operator");
    }
    if (over) {
        diag_error(L->d, e->loc, "%s: integer overflow in %lld %s %lld", what, (long long)a, op_text(e->op),
                   (long long)b);
        return -1;
    }
    return 0;
}

static int eval_int(Lower *L, const Scope *s, const Expr *e, const char *what, int64_t *out)
{
    if (lower_enter(L, e->loc)) return -1;
    int rc = -1;
    switch (e->kind) {
    case EX_NUM: rc = int_literal(L, e, what, out); break;
    case EX_NAME: rc = dim_of(L, s, e, what, out); break;
    case EX_NEG:
        rc = eval_int(L, s, e->lhs, what, out);
        if (rc == 0 && *out == INT64_MIN) {
            diag_error(L->d, e->loc, "%s: integer overflow", what);
            rc = -1;
        }
        if (rc == 0) *out = -*out;
        break;
    case EX_BINARY: rc = int_binary(L, s, e, what, out); break;
    case EX_CALL:
        diag_error(L->d, e->loc, "%s must be an integer of numbers and dims; %s() cannot be used in it",
                   what, e->name);
        break;
    default: rc = not_a_number(L, e, what, "an integer"); break;
    }
    L->depth--;
    return rc;
}

int ce_int(Lower *L, const Scope *s, const Expr *e, const char *what, int64_t *out)
{
    return eval_int(L, s, e, what, out);
}

static int eval_float(Lower *L, const Scope *s, const Expr *e, const char *what, double *out);

static int float_call(Lower *L, const Scope *s, const Expr *e, const char *what, double *out)
{
    if (strcmp(e->name, "sqrt") != 0) {
        diag_error(L->d, e->loc, "%s must be a constant; only sqrt() can be called in it, not %s()",
                   what, e->name);
        return -1;
    }
    int n = 0;
    for (const Arg *a = e->args; a; a = a->next) n++;
    if (n != 1 || e->args->key) {
        diag_error(L->d, e->loc, "sqrt: expects 1 argument, got %d", n);
        return -1;
    }
    if (eval_float(L, s, e->args->value, what, out)) return -1;
    if (*out < 0) {
        diag_error(L->d, e->loc, "%s: sqrt of a negative number (%g)", what, *out);
        return -1;
    }
    *out = sqrt(*out);
    return 0;
}

static int float_binary(Lower *L, const Scope *s, const Expr *e, const char *what, double *out)
{
    if (e->op == '@') return not_a_number(L, e, what, "a number");
    double a, b;
    int ra = eval_float(L, s, e->lhs, what, &a);
    int rb = eval_float(L, s, e->rhs, what, &b);
    if (ra || rb) return -1;
    switch (e->op) {
    case '+': *out = a + b; break;
    case '-': *out = a - b; break;
    case '*': *out = a * b; break;
    case '^': *out = pow(a, b); break;
    case '/':
        if (b == 0) {
            diag_error(L->d, e->loc, "%s: division by zero", what);
            return -1;
        }
        *out = a / b;
        break;
    default: FS_ASSERT(!"binary operator");
    }
    if (isnan(*out)) {
        diag_error(L->d, e->loc, "%s: (%g) ** %g is not a real number", what, a, b);
        return -1;
    }
    if (!isfinite(*out)) {
        diag_error(L->d, e->loc, "%s: the result (%g %s %g) is too large", what, a, op_text(e->op), b);
        return -1;
    }
    return 0;
}

static int eval_float(Lower *L, const Scope *s, const Expr *e, const char *what, double *out)
{
    if (lower_enter(L, e->loc)) return -1;
    int rc = -1;
    int64_t dim;
    switch (e->kind) {
    case EX_NUM:
        *out = e->num;
        rc = isfinite(e->num) ? 0 : -1;
        if (rc) diag_error(L->d, e->loc, "number %s is too large", e->text ? e->text : "");
        break;
    case EX_NAME:
        rc = dim_of(L, s, e, what, &dim);
        *out = (double)dim;
        break;
    case EX_NEG:
        rc = eval_float(L, s, e->lhs, what, out);
        *out = -*out;
        break;
    case EX_BINARY: rc = float_binary(L, s, e, what, out); break;
    case EX_CALL: rc = float_call(L, s, e, what, out); break;
    default: rc = not_a_number(L, e, what, "a number"); break;
    }
    L->depth--;
    return rc;
}

int ce_float(Lower *L, const Scope *s, const Expr *e, const char *what, double *out)
{
    return eval_float(L, s, e, what, out);
}

int64_t ce_numel(const Value *v)
{
    int64_t n = 1;
    for (int i = 0; i < v->rank; i++) {
        if (v->shape[i] <= 0) return 0;
        if (__builtin_mul_overflow(n, v->shape[i], &n) || n > LOWER_MAX_NUMEL) return -1;
    }
    return n;
}

int ce_shape(Lower *L, const Scope *s, const Expr *dims, const char *what, Loc loc, Value *v)
{
    int rank = 0, rc = 0;
    for (const Expr *e = dims; e; e = e->next) rank++;
    if (rank > IR_MAX_RANK) {
        diag_error(L->d, loc, "%s has %d dims; at most %d are supported", what, rank, IR_MAX_RANK);
        return -1;
    }
    char *ctx = arena_printf(L->tmp, "a dim of %s", what);
    v->rank = rank;
    int i = 0;
    for (const Expr *e = dims; e; e = e->next, i++) {
        int64_t x = 1;
        if (ce_int(L, s, e, ctx, &x)) {
            rc = -1;
        } else if (x <= 0) {
            diag_error(L->d, e->loc, "dims must be positive, but this dim of %s is %lld", what,
                       (long long)x);
            rc = -1;
        }
        v->shape[i] = x;
    }
    if (rc) return -1;
    if (ce_numel(v) < 0) {
        char buf[256];
        diag_error(L->d, loc, "%s %s has more than 2^48 elements", what,
                   ir_shape_str(v, buf, sizeof buf));
        return -1;
    }
    return 0;
}

/* Binds an initializer's arguments to its parameter names; slots[i] for names[i]. */
static int init_args(Lower *L, const Expr *e, const char *const *names, int n, const Expr **slots)
{
    int count = 0, rc = 0, pos = 0;
    for (const Arg *a = e->args; a; a = a->next) count++;
    if (count != n) {
        diag_error(L->d, e->loc, "%s: expects %d argument%s (%s%s%s), got %d", e->name, n,
                   n == 1 ? "" : "s", names[0], n > 1 ? ", " : "", n > 1 ? names[1] : "", count);
        return -1;
    }
    for (const Arg *a = e->args; a; a = a->next) {
        int k = pos;
        if (a->key) {
            for (k = 0; k < n && strcmp(names[k], a->key) != 0; k++) {}
            if (k == n) {
                const char *best = diag_closest(a->key, names, n);
                diag_error(L->d, a->key_loc, "%s: no parameter named '%s'; did you mean '%s'?",
                           e->name, a->key, best ? best : names[0]);
                rc = -1;
                continue;
            }
        } else {
            pos++;
        }
        if (k >= n || slots[k]) {
            diag_error(L->d, a->key ? a->key_loc : a->value->loc, "%s: argument '%s' given twice",
                       e->name, names[k < n ? k : n - 1]);
            rc = -1;
            continue;
        }
        slots[k] = a->value;
    }
    return rc;
}

/* normal(std), normal(mean, std), uniform(low, high): v->init_a and init_b are (std,
 * mean) and (low, high). */
static int init_call(Lower *L, const Scope *s, const Expr *e, Value *v)
{
    static const char *const normal1[] = {"std"}, *const normal2[] = {"mean", "std"}, *const uniform[] = {"low", "high"};
    int is_normal = strcmp(e->name, "normal") == 0, count = 0;
    for (const Arg *a = e->args; a; a = a->next) count++;
    if (is_normal && count != 1 && count != 2) {
        diag_error(L->d, e->loc, "normal: expects normal(std) or normal(mean, std), got %d argument%s", count,
                   count == 1 ? "" : "s");
        return -1;
    }
    const char *const *names = !is_normal ? uniform : count == 1 ? normal1 : normal2;
    int n = is_normal ? count : 2;
    const Expr *slots[2] = {NULL, NULL};
    if (init_args(L, e, names, n, slots)) return -1;
    double x[2] = {0, 0};
    int rc = 0;
    for (int i = 0; i < n; i++) {
        char *what = arena_printf(L->tmp, "%s: argument '%s'", e->name, names[i]);
        if (ce_float(L, s, slots[i], what, &x[i])) rc = -1;
    }
    if (rc) return -1;
    if (is_normal) {
        double mean = n == 2 ? x[0] : 0, std = x[n - 1];
        if (!(std > 0)) {
            diag_error(L->d, slots[n - 1]->loc, "normal: std must be positive, got %g", std);
            return -1;
        }
        v->init = INIT_NORMAL, v->init_a = std, v->init_b = mean;
        return 0;
    }
    if (!(x[0] < x[1])) {
        diag_error(L->d, e->loc, "uniform: low (%g) must be less than high (%g)", x[0], x[1]);
        return -1;
    }
    v->init = INIT_UNIFORM, v->init_a = x[0], v->init_b = x[1];
    return 0;
}

int ce_init(Lower *L, const Scope *s, const Expr *e, Value *v)
{
    static const char *const names[] = {"zeros", "ones", "normal", "uniform"};
    static const char *const expected = "zeros, ones, normal(std), normal(mean, std) or uniform(low, high)";
    const char *name = e->kind == EX_NAME || e->kind == EX_CALL ? e->name : NULL;
    if (!name || !lower_is_init_name(name)) {
        const char *best = name ? diag_closest(name, names, 4) : NULL;
        if (best)
            diag_error(L->d, e->loc, "unknown initializer '%s'; did you mean '%s'?", name, best);
        else
            diag_error(L->d, e->loc, "a param's initializer must be %s", expected);
        return -1;
    }
    int plain = strcmp(name, "zeros") == 0 || strcmp(name, "ones") == 0;
    if (plain && e->kind == EX_CALL) {
        diag_error(L->d, e->loc, "'%s' takes no arguments: write `= %s`", name, name);
        return -1;
    }
    if (!plain && e->kind == EX_NAME) {
        diag_error(L->d, e->loc, "'%s' needs its arguments: write `= %s`", name,
                   strcmp(name, "normal") == 0 ? "normal(0.02)" : "uniform(-0.1, 0.1)");
        return -1;
    }
    if (plain) {
        v->init = strcmp(name, "zeros") == 0 ? INIT_ZEROS : INIT_ONES;
        return 0;
    }
    return init_call(L, s, e, v);
}
