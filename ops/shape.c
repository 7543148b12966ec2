/* ops/shape.c: the shape rule of every op (shape_NAME, one per ops.def row), and the
 * types, attributes and helpers the rules share.
 *
 * A rule reads its inputs (c->in, OpTypes) and attributes (op_attr_* on c->attrs), and
 * fills the dtype, rank and shape of each output in c->out; split also sets c->n_out.
 * On a bad call it returns shape_fail(c, ...) with a short lowercase message that
 * starts with the op's name and names every shape involved, e.g.
 *   matmul: inner dims differ: f32[4, 128] @ f32[256, 64] (128 vs 256)
 * The semantics are PyTorch's; where PyTorch would promote dtypes we demand equal ones
 * (a cast is the precision pass's job, not an op's). i32 tensors are indices: they may
 * be added, subtracted, multiplied, negated and moved around (layout and view ops), and
 * they feed embedding, cross_entropy and arange; every other op wants floats.
 *
 * Where it sits: in the op layer, below the IR and the runtime. ir_node_add runs the
 * rule when a node is made and ir_verify re-runs it (attributes read from the node);
 * fsexec's plan check (runtime/opcheck.c) runs it on every plan op (attributes read
 * from the plan). Nothing here knows either.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ops.h"

#define TYPE(v, buf) op_type_str((v), (buf), sizeof(buf))
#define SHAPE(v, buf) op_shape_str((v), (buf), sizeof(buf))

/* ---- attributes and types ------------------------------------------------------ */

int64_t op_attr_int(const OpAttrs *a, const char *key, int64_t def)
{
    OpAttr v;
    if (!a->find || !a->find(a->self, key, &v)) return def;
    return v.kind == OPA_INT ? v.i : v.kind == OPA_FLOAT ? (int64_t)v.f : def;
}

double op_attr_float(const OpAttrs *a, const char *key, double def)
{
    OpAttr v;
    if (!a->find || !a->find(a->self, key, &v)) return def;
    return v.kind == OPA_FLOAT ? v.f : v.kind == OPA_INT ? (double)v.i : def;
}

const int64_t *op_attr_ints(const OpAttrs *a, const char *key, int *len)
{
    OpAttr v;
    if (!a->find || !a->find(a->self, key, &v) || v.kind != OPA_INTS) {
        *len = 0;
        return NULL;
    }
    *len = v.n_ints;
    return v.ints;
}

int64_t op_type_numel(const OpType *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->shape[i];
    return n;
}

int op_type_same_shape(const OpType *a, const OpType *b)
{
    return a->rank == b->rank && !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->rank);
}

char *op_shape_str(const OpType *t, char *buf, size_t len)
{
    size_t at = 0;
    at += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < t->rank && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%" PRId64, i ? ", " : "", t->shape[i]);
    if (at < len) snprintf(buf + at, len - at, "]");
    return buf;
}

char *op_type_str(const OpType *t, char *buf, size_t len)
{
    char shape[160];
    snprintf(buf, len, "%s%s", dtype_name(t->dtype), op_shape_str(t, shape, sizeof shape));
    return buf;
}

int op_shape(ShapeCtx *c)
{
    const OpInfo *info = op_info(c->op);
    c->n_out = info->n_out;
    return info->shape(c);
}

int shape_fail(ShapeCtx *c, const char *fmt, ...)
{
    if (c->err && c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static const char *name_of(const ShapeCtx *c) { return op_name(c->op); }

/* ---- helpers every rule shares --------------------------------------------------- */

static int want_inputs(ShapeCtx *c, int n)
{
    if (c->n_in != n) return shape_fail(c, "%s: expects %d tensor%s, got %d", name_of(c), n, n == 1 ? "" : "s", c->n_in);
    return 0;
}

static int want_float(ShapeCtx *c, const OpType *v)
{
    char t[192];
    if (!dtype_is_float(v->dtype)) return shape_fail(c, "%s: expects a float tensor, got %s", name_of(c), TYPE(v, t));
    return 0;
}

static int want_rank(ShapeCtx *c, const OpType *v, int min)
{
    char t[192];
    if (v->rank < min) return shape_fail(c, "%s: expects a tensor of rank >= %d, got %s", name_of(c), min, TYPE(v, t));
    return 0;
}

static int want_same_dtype(ShapeCtx *c, const OpType *a, const OpType *b)
{
    char ta[192], tb[192];
    if (a->dtype != b->dtype) return shape_fail(c, "%s: dtypes differ: %s and %s", name_of(c), TYPE(a, ta), TYPE(b, tb));
    return 0;
}

/* Output ranks can grow past the limit (heads, embedding, reshape). */
static int want_out_rank(ShapeCtx *c, int rank, const OpType *from)
{
    char t[192];
    if (rank > OPS_MAX_RANK)
        return shape_fail(c, "%s: result of rank %d exceeds the limit of %d (from %s)", name_of(c), rank, OPS_MAX_RANK, TYPE(from, t));
    return 0;
}

/* Normalizes a possibly negative axis of a rank-`rank` tensor into [0, rank). */
static int norm_axis(ShapeCtx *c, const char *what, int64_t axis, const OpType *v, int *out)
{
    char t[192];
    if (axis < -v->rank || axis >= v->rank)
        return shape_fail(c, "%s: %s %" PRId64 " is out of range for %s (rank %d)", name_of(c), what, axis, TYPE(v, t), v->rank);
    *out = (int)(axis < 0 ? axis + v->rank : axis);
    return 0;
}

void shape_set(ShapeCtx *c, int i, DType dt, int rank, const int64_t *shape)
{
    c->out[i].dtype = dt;
    c->out[i].rank = rank;
    for (int d = 0; d < rank; d++) c->out[i].shape[d] = shape[d];
}

static void same_as(ShapeCtx *c, const OpType *v) { shape_set(c, 0, v->dtype, v->rank, v->shape); }

/* numpy broadcasting of a's and b's shapes into out. */
static int broadcast(ShapeCtx *c, const OpType *a, const OpType *b, int64_t *out, int *rout)
{
    int ra = a->rank, rb = b->rank, r = ra > rb ? ra : rb;
    for (int i = 1; i <= r; i++) {
        int64_t da = i <= ra ? a->shape[ra - i] : 1, db = i <= rb ? b->shape[rb - i] : 1;
        if (da != db && da != 1 && db != 1) {
            char sa[160], sb[160];
            return shape_fail(c, "%s: shapes do not broadcast: %s and %s (dim -%d: %" PRId64 " vs %" PRId64 ")",
                              name_of(c), SHAPE(a, sa), SHAPE(b, sb), i, da, db);
        }
        out[r - i] = da == 1 ? db : da;
    }
    *rout = r;
    return 0;
}

/* ---- matmul and elementwise ------------------------------------------------------ */

/* Applies a transpose flag (matmul's ta / tb) to a copy of an operand. */
static int transposed(ShapeCtx *c, OpType *v, const char *flag)
{
    char t[192];
    if (!op_attr_int(&c->attrs, flag, 0)) return 0;
    if (v->rank < 2) return shape_fail(c, "matmul: %s needs a matrix, got %s", flag, TYPE(v, t));
    int64_t last = v->shape[v->rank - 1];
    v->shape[v->rank - 1] = v->shape[v->rank - 2];
    v->shape[v->rank - 2] = last;
    return 0;
}

/* torch.matmul: a 1-D operand is a vector (its dim is dropped from the result); for
 * rank >= 2 the dims before the last two broadcast. */
int shape_matmul(ShapeCtx *c)
{
    if (want_inputs(c, 2)) return -1;
    OpType at = c->in[0], bt = c->in[1];  // as the product sees them: ta / tb applied
    const OpType *a = &at, *b = &bt;
    char ta[192], tb[192];
    if (want_rank(c, a, 1) || want_rank(c, b, 1) || want_float(c, a) || want_float(c, b) || want_same_dtype(c, a, b))
        return -1;
    if (transposed(c, &at, "ta") || transposed(c, &bt, "tb")) return -1;
    int64_t ka = a->shape[a->rank - 1], kb = b->rank == 1 ? b->shape[0] : b->shape[b->rank - 2];
    if (ka != kb)
        return shape_fail(c, "matmul: inner dims differ: %s @ %s (%" PRId64 " vs %" PRId64 ")", TYPE(a, ta), TYPE(b, tb), ka, kb);
    int64_t shape[OPS_MAX_RANK];
    int rank = 0;
    if (a->rank >= 2 && b->rank >= 2) {
        int ra = a->rank - 2, rb = b->rank - 2;
        rank = ra > rb ? ra : rb;
        for (int i = 1; i <= rank; i++) {
            int64_t da = i <= ra ? a->shape[ra - i] : 1, db = i <= rb ? b->shape[rb - i] : 1;
            if (da != db && da != 1 && db != 1)
                return shape_fail(c, "matmul: batch dims do not broadcast: %s @ %s (dim -%d: %" PRId64 " vs %" PRId64 ")",
                                  TYPE(a, ta), TYPE(b, tb), i + 2, da, db);
            shape[rank - i] = da == 1 ? db : da;
        }
        shape[rank++] = a->shape[a->rank - 2];
        shape[rank++] = b->shape[b->rank - 1];
    } else if (a->rank >= 2) {  // [..., M, K] @ [K]
        rank = a->rank - 1;
        memcpy(shape, a->shape, sizeof(int64_t) * (size_t)rank);
    } else if (b->rank >= 2) {  // [K] @ [..., K, N]
        rank = b->rank - 1;
        memcpy(shape, b->shape, sizeof(int64_t) * (size_t)(rank - 1));
        shape[rank - 1] = b->shape[b->rank - 1];
    }                           // [K] @ [K]: a scalar
    shape_set(c, 0, a->dtype, rank, shape);
    return 0;
}

static int binary(ShapeCtx *c, int ints_ok)
{
    if (want_inputs(c, 2)) return -1;
    const OpType *a = &c->in[0], *b = &c->in[1];
    if (want_same_dtype(c, a, b)) return -1;
    if (!ints_ok && (want_float(c, a) || want_float(c, b))) return -1;
    int64_t shape[OPS_MAX_RANK];
    int rank = 0;
    if (broadcast(c, a, b, shape, &rank)) return -1;
    shape_set(c, 0, a->dtype, rank, shape);
    return 0;
}

int shape_add(ShapeCtx *c) { return binary(c, 1); }
int shape_sub(ShapeCtx *c) { return binary(c, 1); }
int shape_mul(ShapeCtx *c) { return binary(c, 1); }
/* PyTorch's true division of integers yields floats; we do not promote. */
int shape_div(ShapeCtx *c) { return binary(c, 0); }

static int unary(ShapeCtx *c, int ints_ok)
{
    if (want_inputs(c, 1)) return -1;
    if (!ints_ok && want_float(c, &c->in[0])) return -1;
    same_as(c, &c->in[0]);
    return 0;
}

int shape_neg(ShapeCtx *c) { return unary(c, 1); }
int shape_exp(ShapeCtx *c) { return unary(c, 0); }
int shape_log(ShapeCtx *c) { return unary(c, 0); }
int shape_sqrt(ShapeCtx *c) { return unary(c, 0); }
int shape_rsqrt(ShapeCtx *c) { return unary(c, 0); }
int shape_tanh(ShapeCtx *c) { return unary(c, 0); }
int shape_sigmoid(ShapeCtx *c) { return unary(c, 0); }
int shape_relu(ShapeCtx *c) { return unary(c, 0); }
int shape_gelu(ShapeCtx *c) { return unary(c, 0); }
int shape_silu(ShapeCtx *c) { return unary(c, 0); }

/* pow(x, p): x ** p elementwise, p a finite constant. */
int shape_pow(ShapeCtx *c)
{
    double p = op_attr_float(&c->attrs, "p", 1);
    if (!isfinite(p)) return shape_fail(c, "pow: the exponent must be a finite number, got %g", p);
    return unary(c, 0);
}

/* ---- reductions and normalizations ----------------------------------------------- */

static int reduce(ShapeCtx *c)
{
    if (want_inputs(c, 1)) return -1;
    const OpType *x = &c->in[0];
    int axis = 0;
    if (want_float(c, x) || want_rank(c, x, 1) || norm_axis(c, "axis", op_attr_int(&c->attrs, "axis", -1), x, &axis))
        return -1;
    int keep = op_attr_int(&c->attrs, "keepdim", 0) != 0;
    int64_t shape[OPS_MAX_RANK];
    int rank = 0;
    for (int d = 0; d < x->rank; d++) {
        if (d != axis) shape[rank++] = x->shape[d];
        else if (keep) shape[rank++] = 1;
    }
    shape_set(c, 0, x->dtype, rank, shape);
    return 0;
}

int shape_sum(ShapeCtx *c) { return reduce(c); }
int shape_mean(ShapeCtx *c) { return reduce(c); }
int shape_max(ShapeCtx *c) { return reduce(c); }

int shape_softmax(ShapeCtx *c)
{
    if (want_inputs(c, 1)) return -1;
    int axis = 0;
    if (want_float(c, &c->in[0]) || want_rank(c, &c->in[0], 1) ||
        norm_axis(c, "axis", op_attr_int(&c->attrs, "axis", -1), &c->in[0], &axis))
        return -1;
    same_as(c, &c->in[0]);
    return 0;
}

/* A norm's weight (and bias) must be [C], C the last dim of x, of x's dtype. */
static int want_channel_vec(ShapeCtx *c, const OpType *x, const OpType *w, const char *what)
{
    char tx[192], tw[192];
    int64_t C = x->shape[x->rank - 1];
    if (w->rank != 1 || w->shape[0] != C)
        return shape_fail(c, "%s: %s must be [%" PRId64 "] for input %s, got %s", name_of(c), what, C, TYPE(x, tx), TYPE(w, tw));
    return want_same_dtype(c, x, w);
}

static int want_eps(ShapeCtx *c)
{
    double eps = op_attr_float(&c->attrs, "eps", 1e-5);
    if (!(eps >= 0)) return shape_fail(c, "%s: eps must be >= 0, got %g", name_of(c), eps);
    return 0;
}

int shape_layernorm(ShapeCtx *c)
{
    if (want_inputs(c, 3)) return -1;
    const OpType *x = &c->in[0];
    if (want_float(c, x) || want_rank(c, x, 1) || want_channel_vec(c, x, &c->in[1], "weight") ||
        want_channel_vec(c, x, &c->in[2], "bias") || want_eps(c))
        return -1;
    same_as(c, x);
    return 0;
}

int shape_rmsnorm(ShapeCtx *c)
{
    if (want_inputs(c, 2)) return -1;
    const OpType *x = &c->in[0];
    if (want_float(c, x) || want_rank(c, x, 1) || want_channel_vec(c, x, &c->in[1], "weight") || want_eps(c)) return -1;
    same_as(c, x);
    return 0;
}

/* ---- lookups and the loss -------------------------------------------------------- */

int shape_embedding(ShapeCtx *c)
{
    if (want_inputs(c, 2)) return -1;
    const OpType *table = &c->in[0], *idx = &c->in[1];
    char tt[192], ti[192];
    if (table->rank != 2 || !dtype_is_float(table->dtype))
        return shape_fail(c, "embedding: table must be a float [V, C] tensor, got %s (indices %s)", TYPE(table, tt), TYPE(idx, ti));
    if (idx->dtype != DT_I32)
        return shape_fail(c, "embedding: indices must be i32, got %s (table %s)", TYPE(idx, ti), TYPE(table, tt));
    if (want_out_rank(c, idx->rank + 1, idx)) return -1;
    int64_t shape[OPS_MAX_RANK];
    memcpy(shape, idx->shape, sizeof(int64_t) * (size_t)idx->rank);
    shape[idx->rank] = table->shape[1];
    shape_set(c, 0, table->dtype, idx->rank + 1, shape);
    return 0;
}

/* logits [..., V] and i32 targets [...]: the mean loss, an f32 scalar, and the rows' terms
 * [..., 2] f32 (ops.h: OPS_LOSS_BLOCKS). `valid` (0: all V) is how many leading columns are
 * the model's: the rest are a padded vocabulary's (passes/pad_vocab.c), -inf to the loss. */
int shape_cross_entropy(ShapeCtx *c)
{
    if (want_inputs(c, 2)) return -1;
    const OpType *lg = &c->in[0], *tg = &c->in[1];
    char tl[192], tt[192];
    if (want_float(c, lg) || want_rank(c, lg, 1)) return -1;
    if (tg->dtype != DT_I32)
        return shape_fail(c, "cross_entropy: targets must be i32, got %s (logits %s)", TYPE(tg, tt), TYPE(lg, tl));
    int ok = tg->rank == lg->rank - 1;
    for (int d = 0; ok && d < tg->rank; d++) ok = tg->shape[d] == lg->shape[d];
    if (!ok) {
        OpType lead = *lg;
        lead.rank = lg->rank - 1;
        char want[160];
        return shape_fail(c, "cross_entropy: targets %s do not match logits %s (expected %s)", TYPE(tg, tt), TYPE(lg, tl),
                          SHAPE(&lead, want));
    }
    int64_t ignore = op_attr_int(&c->attrs, "ignore_index", OPS_NO_IGNORE);
    if (ignore != OPS_NO_IGNORE && !ops_ignores(ignore))
        return shape_fail(c, "cross_entropy: ignore_index %" PRId64 " is not an i32 (targets are i32)", ignore);
    int64_t valid = op_attr_int(&c->attrs, "valid", 0);
    if (valid < 0 || valid > lg->shape[lg->rank - 1])
        return shape_fail(c, "cross_entropy: valid = %lld columns, but the logits %s have %lld", (long long)valid,
                          TYPE(lg, tl), (long long)lg->shape[lg->rank - 1]);
    shape_set(c, 0, DT_F32, 0, NULL);
    int64_t terms[OPS_MAX_RANK];
    memcpy(terms, tg->shape, sizeof(int64_t) * (size_t)tg->rank);
    terms[tg->rank] = 2;
    shape_set(c, 1, DT_F32, tg->rank + 1, terms);  // each row's logsumexp and target logit
    return 0;
}

/* ---- views and layout ------------------------------------------------------------ */

int shape_reshape(ShapeCtx *c)
{
    if (want_inputs(c, 1)) return -1;
    const OpType *x = &c->in[0];
    int n;
    const int64_t *dims = op_attr_ints(&c->attrs, "shape", &n);
    char tx[192], want[192];
    OpType to = {.rank = n <= OPS_MAX_RANK ? n : 0};  // only for printing the request
    for (int d = 0; d < to.rank; d++) to.shape[d] = dims[d];
    if (want_out_rank(c, n, x)) return -1;
    int64_t known = 1;
    int infer = -1;
    for (int d = 0; d < n; d++) {
        if (dims[d] == -1 && infer < 0) infer = d;
        else if (dims[d] == -1) return shape_fail(c, "reshape: more than one -1 in %s (input %s)", SHAPE(&to, want), TYPE(x, tx));
        else if (dims[d] <= 0)
            return shape_fail(c, "reshape: dim %d of %s must be positive or -1 (input %s)", d, SHAPE(&to, want), TYPE(x, tx));
        else if (dims[d] > (INT64_C(1) << 48) / known)
            return shape_fail(c, "reshape: %s has more than 2^48 elements (input %s)", SHAPE(&to, want), TYPE(x, tx));
        else known *= dims[d];
    }
    int64_t numel = op_type_numel(x);
    if (infer >= 0 ? numel % known != 0 : numel != known)
        return shape_fail(c, "reshape: cannot reshape %s (%" PRId64 " elements) to %s", TYPE(x, tx), numel, SHAPE(&to, want));
    if (infer >= 0) to.shape[infer] = numel / known;
    shape_set(c, 0, x->dtype, n, to.shape);
    return 0;
}

int shape_transpose(ShapeCtx *c)
{
    if (want_inputs(c, 1)) return -1;
    const OpType *x = &c->in[0];
    int a = 0, b = 0;
    if (norm_axis(c, "dim", op_attr_int(&c->attrs, "a", -2), x, &a) ||
        norm_axis(c, "dim", op_attr_int(&c->attrs, "b", -1), x, &b))
        return -1;
    same_as(c, x);
    c->out[0].shape[a] = x->shape[b];
    c->out[0].shape[b] = x->shape[a];
    return 0;
}

int shape_permute(ShapeCtx *c)
{
    if (want_inputs(c, 1)) return -1;
    const OpType *x = &c->in[0];
    int n;
    const int64_t *dims = op_attr_ints(&c->attrs, "dims", &n);
    char tx[192];
    if (n != x->rank) return shape_fail(c, "permute: %d dims given for %s (rank %d)", n, TYPE(x, tx), x->rank);
    int seen[OPS_MAX_RANK] = {0};
    int64_t shape[OPS_MAX_RANK];
    for (int i = 0; i < n; i++) {
        int d = 0;
        if (norm_axis(c, "dim", dims[i], x, &d)) return -1;
        if (seen[d]++) return shape_fail(c, "permute: dim %" PRId64 " appears twice for %s", dims[i], TYPE(x, tx));
        shape[i] = x->shape[d];
    }
    shape_set(c, 0, x->dtype, n, shape);
    return 0;
}

int shape_split(ShapeCtx *c)
{
    if (want_inputs(c, 1)) return -1;
    const OpType *x = &c->in[0];
    int64_t n = op_attr_int(&c->attrs, "n", 1);
    int axis = 0;
    char tx[192], sx[160];
    if (n < 1 || n > OPS_MAX_OUT)
        return shape_fail(c, "split: n must be in [1, %d], got %" PRId64 " (input %s)", OPS_MAX_OUT, n, TYPE(x, tx));
    if (want_rank(c, x, 1) || norm_axis(c, "axis", op_attr_int(&c->attrs, "axis", -1), x, &axis)) return -1;
    if (x->shape[axis] % n)
        return shape_fail(c, "split: dim %d of %s (%" PRId64 ") is not divisible by %" PRId64, axis, SHAPE(x, sx),
                          x->shape[axis], n);
    c->n_out = (int)n;
    for (int i = 0; i < n; i++) {
        shape_set(c, i, x->dtype, x->rank, x->shape);
        c->out[i].shape[axis] = x->shape[axis] / n;
    }
    return 0;
}

int shape_concat(ShapeCtx *c)
{
    char ta[192], tb[192];
    if (c->n_in < 1) return shape_fail(c, "concat: expects at least 1 tensor, got 0");
    const OpType *a = &c->in[0];
    int axis = 0;
    if (want_rank(c, a, 1) || norm_axis(c, "axis", op_attr_int(&c->attrs, "axis", -1), a, &axis)) return -1;
    int64_t total = 0;
    for (int i = 0; i < c->n_in; i++) {
        const OpType *b = &c->in[i];
        if (want_same_dtype(c, a, b)) return -1;
        if (b->rank != a->rank)
            return shape_fail(c, "concat: ranks differ: %s and %s (input %d)", TYPE(a, ta), TYPE(b, tb), i);
        for (int d = 0; d < a->rank; d++)
            if (d != axis && a->shape[d] != b->shape[d])
                return shape_fail(c, "concat: shapes differ outside axis %d: %s and %s (dim %d: %" PRId64 " vs %" PRId64 ")",
                                  axis, TYPE(a, ta), TYPE(b, tb), d, a->shape[d], b->shape[d]);
        total += b->shape[axis];
    }
    same_as(c, a);
    c->out[0].shape[axis] = total;
    return 0;
}

/* (..., T, C) -> (..., n, T, C/n) */
int shape_heads(ShapeCtx *c)
{
    if (want_inputs(c, 1)) return -1;
    const OpType *x = &c->in[0];
    int64_t n = op_attr_int(&c->attrs, "n", 1);
    char tx[192];
    if (want_rank(c, x, 2) || want_out_rank(c, x->rank + 1, x)) return -1;
    int r = x->rank;
    int64_t T = x->shape[r - 2], C = x->shape[r - 1];
    if (n < 1) return shape_fail(c, "heads: n must be positive, got %" PRId64 " (input %s)", n, TYPE(x, tx));
    if (C % n) return shape_fail(c, "heads: last dim of %s (%" PRId64 ") is not divisible by %" PRId64, TYPE(x, tx), C, n);
    shape_set(c, 0, x->dtype, r + 1, x->shape);
    c->out[0].shape[r - 2] = n;
    c->out[0].shape[r - 1] = T;
    c->out[0].shape[r] = C / n;
    return 0;
}

/* (..., n, T, D) -> (..., T, n*D) */
int shape_merge_heads(ShapeCtx *c)
{
    if (want_inputs(c, 1)) return -1;
    const OpType *x = &c->in[0];
    if (want_rank(c, x, 3)) return -1;
    int r = x->rank;
    shape_set(c, 0, x->dtype, r - 1, x->shape);
    c->out[0].shape[r - 3] = x->shape[r - 2];
    c->out[0].shape[r - 2] = x->shape[r - 3] * x->shape[r - 1];
    return 0;
}

/* ---- attention ------------------------------------------------------------------- */

int shape_rope(ShapeCtx *c)
{
    if (want_inputs(c, 1)) return -1;
    const OpType *x = &c->in[0];
    char tx[192];
    if (want_float(c, x) || want_rank(c, x, 2)) return -1;
    if (x->shape[x->rank - 1] % 2) return shape_fail(c, "rope: last dim of %s must be even", TYPE(x, tx));
    double theta = op_attr_float(&c->attrs, "theta", 10000);
    if (!(theta > 0)) return shape_fail(c, "rope: theta must be positive, got %g", theta);
    same_as(c, x);
    return 0;
}

/* q (..., T, D), k (..., S, D), v (..., S, Dv) -> (..., T, Dv) and the f32 row
 * log-sum-exp (..., T); batch dims equal, but for the heads dim (the one before T) of
 * grouped-query attention: q (..., NH, T, D) with k, v (..., NKV, S, D), NH a multiple
 * of NKV, query head h reading kv head h / (NH / NKV) (repeat_interleave). */
int shape_attention(ShapeCtx *c)
{
    if (want_inputs(c, 3)) return -1;
    const OpType *q = &c->in[0], *k = &c->in[1], *v = &c->in[2];
    char tq[192], tk[192], tv[192];
    for (int i = 0; i < 3; i++)
        if (want_float(c, &c->in[i]) || want_rank(c, &c->in[i], 2)) return -1;
    if (want_same_dtype(c, q, k) || want_same_dtype(c, q, v)) return -1;
    int r = q->rank;
    if (k->rank != r || v->rank != r)
        return shape_fail(c, "attention: ranks differ: q %s, k %s, v %s", TYPE(q, tq), TYPE(k, tk), TYPE(v, tv));
    for (int d = 0; d < r - 3; d++)
        if (k->shape[d] != q->shape[d] || v->shape[d] != q->shape[d])
            return shape_fail(c, "attention: batch dims differ: q %s, k %s, v %s (dim %d)", TYPE(q, tq), TYPE(k, tk), TYPE(v, tv), d);
    if (r >= 3) {
        int64_t nh = q->shape[r - 3], nkv = k->shape[r - 3];
        if (v->shape[r - 3] != nkv)
            return shape_fail(c, "attention: k and v head counts differ: k %s has %" PRId64 ", v %s has %" PRId64, TYPE(k, tk), nkv,
                              TYPE(v, tv), v->shape[r - 3]);
        if (nh % nkv)
            return shape_fail(c, "attention: q's %" PRId64 " heads are not a multiple of k and v's %" PRId64
                              " (grouped-query attention needs NH %% NKV == 0): q %s, k %s",
                              nh, nkv, TYPE(q, tq), TYPE(k, tk));
    }
    int64_t T = q->shape[r - 2], S = k->shape[r - 2];
    if (k->shape[r - 1] != q->shape[r - 1])
        return shape_fail(c, "attention: head dims differ: q %s, k %s (%" PRId64 " vs %" PRId64 ")", TYPE(q, tq), TYPE(k, tk),
                          q->shape[r - 1], k->shape[r - 1]);
    if (v->shape[r - 2] != S)
        return shape_fail(c, "attention: k and v lengths differ: k %s, v %s (%" PRId64 " vs %" PRId64 ")", TYPE(k, tk), TYPE(v, tv),
                          S, v->shape[r - 2]);
    if (op_attr_int(&c->attrs, "causal", 0) && T != S)
        return shape_fail(c, "attention: causal needs equal lengths: q %s, k %s (%" PRId64 " vs %" PRId64 ")", TYPE(q, tq),
                          TYPE(k, tk), T, S);
    shape_set(c, 0, q->dtype, r, q->shape);
    c->out[0].shape[r - 1] = v->shape[r - 1];
    shape_set(c, 1, DT_F32, r - 1, q->shape);  // the row log-sum-exp, saved for backward
    return 0;
}

/* pos: the i32 [1] position a decode op's first row is at. */
static int want_pos(ShapeCtx *c, const OpType *pos)
{
    char t[192];
    if (pos->dtype != DT_I32 || pos->rank != 1 || pos->shape[0] != 1)
        return shape_fail(c, "%s: pos must be an i32 [1] position, got %s", name_of(c), TYPE(pos, t));
    return 0;
}

/* rope_at(x [..., T, D], pos): rope with row t at position pos + t. */
int shape_rope_at(ShapeCtx *c)
{
    if (want_inputs(c, 2) || want_pos(c, &c->in[1])) return -1;
    c->n_in = 1;  // x alone is rope's
    int rc = shape_rope(c);
    c->n_in = 2;
    return rc;
}

/* attention_decode(q [..., NH, T, D], k [..., NKV, T, D], v [..., NKV, T, Dv],
 * kcache [..., NKV, S, D], vcache [..., NKV, S, Dv], pos) -> o [..., NH, T, Dv]: k and v
 * written into the caches at rows pos .. pos + T - 1, then causal attention of q (row t
 * at position pos + t) over the cache rows up to its own. The caches are attention's
 * k and v of length S, so the rule is attention's on (q, kcache, vcache), non-causal. */
int shape_attention_decode(ShapeCtx *c)
{
    if (want_inputs(c, 6) || want_pos(c, &c->in[5])) return -1;
    const OpType *q = &c->in[0], *k = &c->in[1], *v = &c->in[2], *kc = &c->in[3], *vc = &c->in[4];
    char tk[192], tc[192];
    for (int i = 0; i < 2; i++) {
        const OpType *x = i ? v : k, *cache = i ? vc : kc;
        int r = x->rank, same = r == cache->rank && r >= 2 && x->dtype == cache->dtype && x->shape[r - 2] == q->shape[r - 2];
        for (int d = 0; same && d < r; d++) same = d == r - 2 || x->shape[d] == cache->shape[d];
        if (!same)
            return shape_fail(c, "attention_decode: %s %s does not fit its cache %s (the cache's rows aside) with q's %" PRId64
                              " rows", i ? "v" : "k", TYPE(x, tk), TYPE(cache, tc), q->rank >= 2 ? q->shape[q->rank - 2] : 0);
    }
    ShapeCtx a = *c;
    a.in[1] = *kc, a.in[2] = *vc, a.n_in = 3;
    a.attrs = (OpAttrs){0};
    if (shape_attention(&a)) return -1;
    int r = q->rank;
    if (q->shape[r - 2] > kc->shape[r - 2])
        return shape_fail(c, "attention_decode: %" PRId64 " rows, more than the cache's %" PRId64, q->shape[r - 2],
                          kc->shape[r - 2]);
    c->n_out = 1;
    c->out[0] = a.out[0];
    return 0;
}

/* attention_masked(q [B, ..., T, D], k [B, ..., S, D], v, mask [B, S], causal): attention's rule, and
 * the mask one row of S keys per batch item (q's first dim): i32 (boolean) or q's float dtype (additive). */
int shape_attention_masked(ShapeCtx *c)
{
    if (want_inputs(c, 4)) return -1;
    const OpType *q = &c->in[0], *k = &c->in[1], *m = &c->in[3];
    char tq[192], tm[192];
    ShapeCtx a = *c;
    a.n_in = 3;
    if (shape_attention(&a)) return -1;
    if (q->rank < 3)
        return shape_fail(c, "attention_masked: q %s has no batch dim (expects [B, T, D] or [B, NH, T, D])",
                          TYPE(q, tq));
    int64_t B = q->shape[0], S = k->shape[k->rank - 2];
    if ((m->dtype != DT_I32 && m->dtype != q->dtype) || m->rank != 2 || m->shape[0] != B || m->shape[1] != S)
        return shape_fail(c, "attention_masked: mask %s must be i32[%" PRId64 ", %" PRId64 "] (q's batch, k's length; "
                          "1 attends, 0 masks the key) or %s[%" PRId64 ", %" PRId64 "] (added to the scaled scores, "
                          "-inf masks the key), with q %s", TYPE(m, tm), B, S, dtype_name(q->dtype), B, S, TYPE(q, tq));
    c->out[0] = a.out[0], c->out[1] = a.out[1];
    return 0;
}

/* attention_qkv_masked(qkv [B, T, W], mask [B, T], nh, nkv, causal): attention_qkv's rule, and attention_masked's
 * mask (one row of the T keys per batch item; i32 or qkv's float dtype). */
int shape_attention_qkv_masked(ShapeCtx *c)
{
    if (want_inputs(c, 2)) return -1;
    const OpType *x = &c->in[0], *m = &c->in[1];
    char tx[192], tm[192];
    ShapeCtx a = *c;
    a.n_in = 1;
    if (shape_attention_qkv(&a)) return -1;
    if (x->rank != 3 || (m->dtype != DT_I32 && m->dtype != x->dtype) || m->rank != 2 || m->shape[0] != x->shape[0] ||
        m->shape[1] != x->shape[1])
        return shape_fail(c, "attention_qkv_masked: mask %s must be i32 or %s [B, T] for qkv %s [B, T, W]",
                          TYPE(m, tm), dtype_name(x->dtype), TYPE(x, tx));
    c->out[0] = a.out[0], c->out[1] = a.out[1];
    return 0;
}

/* attention_qkv(qkv [..., T, (nh + 2 nkv) D], nh, nkv, causal) -> o [..., T, nh D] and the
 * f32 row log-sum-exp [..., nh, T]: attention of the heads a row of qkv holds side by side
 * (q heads, then k heads, then v heads; passes/packed_attn.c), o's heads side by side. */
int shape_attention_qkv(ShapeCtx *c)
{
    if (want_inputs(c, 1)) return -1;
    const OpType *x = &c->in[0];
    char tx[192];
    if (want_float(c, x) || want_rank(c, x, 2)) return -1;
    int64_t nh = op_attr_int(&c->attrs, "nh", 0), nkv = op_attr_int(&c->attrs, "nkv", 0), r = x->rank;
    if (nh < 1 || nkv < 1 || nh % nkv)
        return shape_fail(c, "attention_qkv: nh = %" PRId64 " query heads over nkv = %" PRId64
                          " kv heads (both >= 1, nh a multiple of nkv)", nh, nkv);
    int64_t W = x->shape[r - 1], heads = nh + 2 * nkv;
    if (W % heads)
        return shape_fail(c, "attention_qkv: %s's rows of %" PRId64 " are not %" PRId64 " heads of one width",
                          TYPE(x, tx), W, heads);
    shape_set(c, 0, x->dtype, (int)r, x->shape);
    c->out[0].shape[r - 1] = W / heads * nh;
    int64_t lse[OPS_MAX_RANK];
    for (int d = 0; d < r - 2; d++) lse[d] = x->shape[d];
    lse[r - 2] = nh, lse[r - 1] = x->shape[r - 2];
    shape_set(c, 1, DT_F32, (int)r, lse);  // attention's row log-sum-exp, saved for backward
    return 0;
}

/* rope_rows(x [..., T, n D], n): rope of heads(x, n) [..., n, T, D] on x's own layout (the same numbers); x's
 * dtype, rank and theta as rope's rule checks them. */
int shape_rope_rows(ShapeCtx *c)
{
    if (want_inputs(c, 1)) return -1;
    const OpType *x = &c->in[0];
    char tx[192];
    int64_t n = op_attr_int(&c->attrs, "n", 0), W = x->rank ? x->shape[x->rank - 1] : 0;
    if (n < 1 || W % n || (W / n) % 2)
        return shape_fail(c, "rope_rows: %s's rows are not %" PRId64 " heads of one even width", TYPE(x, tx), n);
    return shape_rope(c);
}

/* attention_rows(q [..., T, nh D], k [..., T, nkv D], v [..., T, nkv D], nh, nkv, causal) -> o [..., T, nh D]
 * and the f32 row log-sum-exp [..., nh, T]: attention of heads(q, nh), heads(k, nkv), heads(v, nkv), its
 * output's heads side by side (merge_heads' layout). */
int shape_attention_rows(ShapeCtx *c)
{
    if (want_inputs(c, 3)) return -1;
    const OpType *q = &c->in[0], *k = &c->in[1], *v = &c->in[2];
    char tq[192], tk[192], tv[192];
    for (int i = 0; i < 3; i++)
        if (want_float(c, &c->in[i]) || want_rank(c, &c->in[i], 2) || want_same_dtype(c, q, &c->in[i])) return -1;
    int64_t nh = op_attr_int(&c->attrs, "nh", 0), nkv = op_attr_int(&c->attrs, "nkv", 0), r = q->rank;
    if (nh < 1 || nkv < 1 || nh % nkv)
        return shape_fail(c, "attention_rows: nh = %" PRId64 " query heads over nkv = %" PRId64
                          " kv heads (both >= 1, nh a multiple of nkv)", nh, nkv);
    int64_t D = q->shape[r - 1] / nh;
    int ok = k->rank == r && v->rank == r && q->shape[r - 1] == nh * D && k->shape[r - 1] == nkv * D &&
             v->shape[r - 1] == nkv * D;
    for (int d = 0; ok && d < r - 1; d++) ok = k->shape[d] == q->shape[d] && v->shape[d] == q->shape[d];
    if (!ok)
        return shape_fail(c, "attention_rows: q %s, k %s, v %s are not %" PRId64 " and %" PRId64
                          " heads of one width over the same rows", TYPE(q, tq), TYPE(k, tk), TYPE(v, tv), nh, nkv);
    shape_set(c, 0, q->dtype, (int)r, q->shape);
    int64_t lse[OPS_MAX_RANK];
    for (int d = 0; d < r - 2; d++) lse[d] = q->shape[d];
    lse[r - 2] = nh, lse[r - 1] = q->shape[r - 2];
    shape_set(c, 1, DT_F32, (int)r, lse);  // attention's row log-sum-exp, saved for backward
    return 0;
}

/* ---- constants ------------------------------------------------------------------- */

int shape_arange(ShapeCtx *c)
{
    if (want_inputs(c, 0)) return -1;
    int64_t n = op_attr_int(&c->attrs, "n", 0);
    if (n < 1) return shape_fail(c, "arange: n must be positive, got %" PRId64, n);
    shape_set(c, 0, DT_I32, 1, &n);
    return 0;
}

int shape_scalar(ShapeCtx *c)
{
    if (want_inputs(c, 0)) return -1;
    shape_set(c, 0, DT_F32, 0, NULL);
    return 0;
}

/* dropout(x, rng): x's type; rng is the step's RNG words, i32 [4] (plan.h: PLAN_SR_RNG). */
int shape_dropout(ShapeCtx *c)
{
    if (want_inputs(c, 2) || want_float(c, &c->in[0])) return -1;
    const OpType *r = &c->in[1];
    if (r->dtype != DT_I32 || r->rank != 1 || r->shape[0] != 4)
        return shape_fail(c, "dropout: the rng input must be i32 [4]");
    double p = op_attr_float(&c->attrs, "p", 0);
    if (!(p >= 0 && p < 1)) return shape_fail(c, "dropout: p must be in [0, 1), got %g", p);
    same_as(c, &c->in[0]);
    return 0;
}
