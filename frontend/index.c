/* frontend/index.c: indexing and slicing, `x[:, 0, :]`, `x[:, 1:, :]`, `x[..., a:b]`.
 *
 * Python's meaning with static bounds: item d of the brackets applies to dim d (dims after
 * the last item are kept whole); an integer picks one position and drops the dim, a slice
 * `start:stop` keeps [start, stop) (either side omitted: 0, the dim's size). Negative
 * integers and bounds count from the end. Bounds are constant expressions of numbers and
 * dims; one outside the dim (an integer outside [-size, size), a bound outside
 * [-size, size], an empty slice) is an error where Python would clamp, since a shape of
 * 0 is never what a model means. No steps (`a:b:c`): the grammar has none.
 *
 * Each dim that does not keep all its positions becomes one `slice` node (a copy, which
 * passes/slice_view.c turns into a view where its positions are one run of the input's
 * bytes), and the dropped dims one `reshape` (a view) at the end, so the gradient is
 * the op table's: slice's is slice_bwd, zeros of the input's shape with the rows
 * written in. The batch dim (the first dim of a value that depends on the batch inputs)
 * is each rank's part of the global batch, so it may only be kept whole.
 *
 * Where it sits: lower_expr (expr.c) calls lower_index for an EX_INDEX.
 */
#include <string.h>

#include "lower.h"

/* A slice bound in [-size, size], made non-negative; -1 after an error. */
static int bound(Lower *L, Scope *s, const Expr *e, int d, int64_t size, const char *what, int64_t *out)
{
    char *desc = arena_printf(L->tmp, "the slice %s of dim %d", what, d);
    if (ce_int(L, s, e, desc, out)) return -1;
    if (*out < -size || *out > size) {
        diag_error(L->d, e->loc, "slice %s %lld is out of range for dim %d of size %lld", what, (long long)*out, d,
                   (long long)size);
        return -1;
    }
    if (*out < 0) *out += size;
    return 0;
}

/* The positions [start, stop) item `it` keeps of dim d (size long); *drop when it is an
 * integer. 0, or -1 after an error. */
static int item_range(Lower *L, Scope *s, const Expr *it, int d, int64_t size, int64_t *start, int64_t *stop,
                      int *drop)
{
    *drop = it->kind != EX_SLICE;
    if (*drop) {
        int64_t i;
        char *desc = arena_printf(L->tmp, "the index of dim %d", d);
        if (ce_int(L, s, it, desc, &i)) return -1;
        if (i < -size || i >= size) {
            diag_error(L->d, it->loc, "index %lld is out of range for dim %d of size %lld", (long long)i, d,
                       (long long)size);
            return -1;
        }
        *start = i < 0 ? i + size : i;
        *stop = *start + 1;
        return 0;
    }
    *start = 0, *stop = size;
    int rc = 0;
    if (it->lhs && bound(L, s, it->lhs, d, size, "start", start)) rc = -1;
    if (it->rhs && bound(L, s, it->rhs, d, size, "stop", stop)) rc = -1;
    if (rc == 0 && *start >= *stop) {
        diag_error(L->d, it->loc, "the slice [%lld:%lld] of dim %d (size %lld) is empty", (long long)*start,
                   (long long)*stop, d, (long long)size);
        return -1;
    }
    return rc;
}

/* Whether dim 0 of value x is the batch: the batch dim's size, and x depends on a batch input. */
static int batch_first(Lower *L, int x)
{
    const char *name = L->g->batch_dim;
    const Binding *b = name ? scope_find(&L->model, name) : NULL;
    const Value *v = ir_value(L->g, x);
    return b && b->kind == B_DIM && !b->poisoned && v->rank > 0 && v->shape[0] == b->dim && lower_from_batch(L, x);
}

RVal lower_index(Lower *L, Scope *s, const Expr *e)
{
    RVal base = lower_expr(L, s, e->lhs);
    int x = lower_one_value(L, base, e->lhs->loc), n = 0;
    for (const Expr *it = e->items; it; it = it->next) n++;
    if (x < 0) return (RVal){.kind = RV_POISON, .id = -1};
    const Value *v = ir_value(L->g, x);
    int rank = v->rank;
    int64_t shape[IR_MAX_RANK], keep[IR_MAX_RANK];
    memcpy(shape, v->shape, sizeof shape);
    if (n > rank) {
        char buf[192];
        diag_error(L->d, e->loc, "%d indices for %s, which has %d dim%s", n, ir_type_str(v, buf, sizeof buf), rank,
                   rank == 1 ? "" : "s");
        return (RVal){.kind = RV_POISON, .id = -1};
    }
    int64_t start[IR_MAX_RANK], stop[IR_MAX_RANK];
    int drop[IR_MAX_RANK] = {0}, rc = 0, d = 0, n_keep = 0, any_drop = 0;
    for (const Expr *it = e->items; it; it = it->next, d++)
        if (item_range(L, s, it, d, shape[d], &start[d], &stop[d], &drop[d])) rc = -1;
    if (rc) return (RVal){.kind = RV_POISON, .id = -1};
    if (n > 0 && (start[0] > 0 || stop[0] < shape[0]) && batch_first(L, x)) {
        diag_error(L->d, e->items->loc,
                   "dim 0 is the batch dim %s, which fsc splits over data-parallel ranks and micro-batches; index it "
                   "only with ':'", L->g->batch_dim);
        return (RVal){.kind = RV_POISON, .id = -1};
    }
    RVal r = {.kind = RV_VALUE, .id = x};
    for (d = 0; d < rank; d++) {
        if (d < n && (start[d] > 0 || stop[d] < shape[d])) {
            Attr a[3] = {{.key = "axis", .kind = ATTR_INT, .i = d},
                         {.key = "start", .kind = ATTR_INT, .i = start[d]},
                         {.key = "len", .kind = ATTR_INT, .i = stop[d] - start[d]}};
            r = lower_add_node(L, OP_slice, &r.id, 1, a, 3, e->loc);
            if (r.kind != RV_VALUE) return r;
        }
        if (d < n && drop[d]) any_drop = 1;
        else keep[n_keep++] = d < n ? stop[d] - start[d] : shape[d];
    }
    if (!any_drop) return r;
    Attr a = {.key = "shape", .kind = ATTR_INTS, .ints = keep, .n_list = n_keep};
    return lower_add_node(L, OP_reshape, &r.id, 1, &a, 1, e->loc);
}
