/* ops/shape_bwd.c: shape rules of the ops the compiler makes itself: constants, the
 * backward ops autodiff emits, and the optimizer's ops. They are never written in
 * source, so a failing rule here means a pass built a bad node; the messages still name
 * the shapes, for whoever debugs that pass.
 *
 * Where it sits: with ops/shape.c, run by ir_node_add, ir_verify and fsexec's plan check.
 */
#include <inttypes.h>
#include <string.h>

#include "ops.h"

static int want_in(ShapeCtx *c, int n)
{
    if (c->n_in != n) return shape_fail(c, "%s: expects %d tensors, got %d", op_name(c->op), n, c->n_in);
    return 0;
}

/* Output i typed like value v. */
static void like(ShapeCtx *c, int i, const OpType *v) { shape_set(c, i, v->dtype, v->rank, v->shape); }

/* The `shape` attribute as the output's shape, with x's dtype. */
static int shape_attr(ShapeCtx *c, DType dt)
{
    int n;
    const int64_t *s = op_attr_ints(&c->attrs, "shape", &n);
    if (n < 0 || n > OPS_MAX_RANK) return shape_fail(c, "%s: rank %d out of range", op_name(c->op), n);
    for (int i = 0; i < n; i++)
        if (s[i] < 1) return shape_fail(c, "%s: dim %d of the shape is %" PRId64, op_name(c->op), i, s[i]);
    shape_set(c, 0, dt, n, s);
    return 0;
}

/* Whether `small` broadcasts to `big` (numpy rules, aligned right). */
static int broadcasts_to(const int64_t *small, int rs, const OpType *big)
{
    if (rs > big->rank) return 0;
    for (int i = 1; i <= rs; i++)
        if (small[rs - i] != 1 && small[rs - i] != big->shape[big->rank - i]) return 0;
    return 1;
}

int shape_full(ShapeCtx *c)
{
    int64_t dt = op_attr_int(&c->attrs, "dtype", DT_F32);
    if (dt < 0 || dt >= DT_COUNT || dt == DT_I32) return shape_fail(c, "full: dtype %" PRId64 " is not a float dtype", dt);
    return want_in(c, 0) ? -1 : shape_attr(c, (DType)dt);
}

/* buffer(shape, dtype): full's type, no value. */
int shape_buffer(ShapeCtx *c)
{
    int64_t dt = op_attr_int(&c->attrs, "dtype", DT_F32);
    if (dt < 0 || dt >= DT_COUNT || dt == DT_I32)
        return shape_fail(c, "buffer: dtype %" PRId64 " is not a float dtype", dt);
    return want_in(c, 0) ? -1 : shape_attr(c, (DType)dt);
}

/* sum_to(x, shape): x reduced to a shape that broadcasts to x's. */
int shape_sum_to(ShapeCtx *c)
{
    if (want_in(c, 1) || shape_attr(c, c->in[0].dtype)) return -1;
    char t[192];
    if (!broadcasts_to(c->out[0].shape, c->out[0].rank, &c->in[0]))
        return shape_fail(c, "sum_to: shape does not broadcast to %s", op_type_str(&c->in[0], t, sizeof t));
    return 0;
}

/* expand(x, shape): x broadcast up to shape. */
int shape_expand(ShapeCtx *c)
{
    if (want_in(c, 1) || shape_attr(c, c->in[0].dtype)) return -1;
    char t[192];
    if (!broadcasts_to(c->in[0].shape, c->in[0].rank, &c->out[0]))
        return shape_fail(c, "expand: %s does not broadcast to the shape", op_type_str(&c->in[0], t, sizeof t));
    return 0;
}

/* (x or y, dy) -> dx, all of one shape. */
static int pointwise_bwd(ShapeCtx *c)
{
    char a[192], b[192];
    if (want_in(c, 2)) return -1;
    if (!op_type_same_shape(&c->in[0], &c->in[1]) || c->in[0].dtype != c->in[1].dtype)
        return shape_fail(c, "%s: %s and %s differ", op_name(c->op), op_type_str(&c->in[0], a, sizeof a),
                          op_type_str(&c->in[1], b, sizeof b));
    like(c, 0, &c->in[0]);
    return 0;
}

int shape_relu_bwd(ShapeCtx *c) { return pointwise_bwd(c); }
int shape_gelu_bwd(ShapeCtx *c) { return pointwise_bwd(c); }
int shape_silu_bwd(ShapeCtx *c) { return pointwise_bwd(c); }
int shape_tanh_bwd(ShapeCtx *c) { return pointwise_bwd(c); }
int shape_sigmoid_bwd(ShapeCtx *c) { return pointwise_bwd(c); }
int shape_sqrt_bwd(ShapeCtx *c) { return pointwise_bwd(c); }
int shape_rsqrt_bwd(ShapeCtx *c) { return pointwise_bwd(c); }
int shape_pow_bwd(ShapeCtx *c) { return pointwise_bwd(c); }
int shape_softmax_bwd(ShapeCtx *c) { return pointwise_bwd(c); }

int shape_max_bwd(ShapeCtx *c)
{
    if (want_in(c, 2)) return -1;
    like(c, 0, &c->in[0]);
    return 0;
}

/* (x, w, dy[, r]) -> dx like x, then dw (and db) like w; r (the _add forms: added to dx)
 * of dx's type. */
static int norm_bwd(ShapeCtx *c, int n_out, int n_in)
{
    if (want_in(c, n_in)) return -1;
    char a[192], b[192];
    if (!op_type_same_shape(&c->in[0], &c->in[2]))
        return shape_fail(c, "%s: x %s and dy %s differ", op_name(c->op), op_type_str(&c->in[0], a, sizeof a),
                          op_type_str(&c->in[2], b, sizeof b));
    if (n_in == 4 && (!op_type_same_shape(&c->in[0], &c->in[3]) || c->in[3].dtype != c->in[0].dtype))
        return shape_fail(c, "%s: r %s is not dx's type %s", op_name(c->op), op_type_str(&c->in[3], a, sizeof a),
                          op_type_str(&c->in[0], b, sizeof b));
    like(c, 0, &c->in[0]);
    for (int i = 1; i < n_out; i++) like(c, i, &c->in[1]);
    return 0;
}

int shape_layernorm_bwd(ShapeCtx *c) { return norm_bwd(c, 3, 3); }
int shape_rmsnorm_bwd(ShapeCtx *c) { return norm_bwd(c, 2, 3); }
int shape_layernorm_bwd_add(ShapeCtx *c) { return norm_bwd(c, 3, 4); }
int shape_rmsnorm_bwd_add(ShapeCtx *c) { return norm_bwd(c, 2, 4); }

/* (idx [...], dy [..., C], rows) -> [rows, C] */
int shape_embedding_bwd(ShapeCtx *c)
{
    if (want_in(c, 2)) return -1;
    const OpType *dy = &c->in[1];
    int64_t s[2] = {op_attr_int(&c->attrs, "rows", 0), dy->shape[dy->rank - 1]};
    if (s[0] < 1 || dy->rank != c->in[0].rank + 1) return shape_fail(c, "embedding_bwd: bad rows or dy rank");
    shape_set(c, 0, dy->dtype, 2, s);
    return 0;
}

/* embedding_bwd_into(acc [rows, C], idx [...], dy [..., C]): acc's type, dy's rows added. */
int shape_embedding_bwd_into(ShapeCtx *c)
{
    if (want_in(c, 3)) return -1;
    const OpType *acc = &c->in[0], *idx = &c->in[1], *dy = &c->in[2];
    int ok = acc->rank == 2 && dtype_is_float(acc->dtype) && idx->dtype == DT_I32 && dtype_is_float(dy->dtype) &&
             dy->rank == idx->rank + 1 && dy->shape[dy->rank - 1] == acc->shape[1];
    for (int d = 0; ok && d < idx->rank; d++) ok = dy->shape[d] == idx->shape[d];
    if (!ok) {
        char ta[192], ti[192], td[192];
        return shape_fail(c, "embedding_bwd_into: acc %s, idx %s and dy %s do not fit (a float [rows, C], i32 [...] "
                          "and float [..., C])", op_type_str(acc, ta, sizeof ta), op_type_str(idx, ti, sizeof ti),
                          op_type_str(dy, td, sizeof td));
    }
    like(c, 0, acc);
    return 0;
}

int shape_cross_entropy_bwd(ShapeCtx *c)
{
    if (want_in(c, 3)) return -1;
    like(c, 0, &c->in[0]);
    return 0;
}

/* cross_entropy_fused(logits, targets, dloss): cross_entropy's two outputs, then dlogits
 * typed like the logits (written over them); dloss a float scalar, as the kernels read it. */
int shape_cross_entropy_fused(ShapeCtx *c)
{
    if (want_in(c, 3)) return -1;
    ShapeCtx loss = *c;
    loss.n_in = 2;
    if (shape_cross_entropy(&loss)) return -1;  // its message is in c->err
    const OpType *g = &c->in[2];
    if (!dtype_is_float(g->dtype) || op_type_numel(g) != 1) {
        char t[192];
        return shape_fail(c, "cross_entropy_fused: dloss %s should be a float scalar", op_type_str(g, t, sizeof t));
    }
    like(c, 0, &loss.out[0]);
    like(c, 1, &loss.out[1]);
    like(c, 2, &c->in[0]);
    return 0;
}

int shape_slice(ShapeCtx *c)
{
    if (want_in(c, 1)) return -1;
    const OpType *x = &c->in[0];
    int64_t axis = op_attr_int(&c->attrs, "axis", 0), start = op_attr_int(&c->attrs, "start", 0),
            len = op_attr_int(&c->attrs, "len", 0);
    char t[192];
    if (axis < 0) axis += x->rank;
    if (axis < 0 || axis >= x->rank || start < 0 || len < 1 || start + len > x->shape[axis])
        return shape_fail(c, "slice: [%" PRId64 ", +%" PRId64 ") along axis %" PRId64 " is outside %s", start, len, axis,
                          op_type_str(x, t, sizeof t));
    like(c, 0, x);
    c->out[0].shape[axis] = len;
    return 0;
}

/* slice_view: slice's shape; where its bytes lie is passes/slice_view.c's. */
int shape_slice_view(ShapeCtx *c) { return shape_slice(c); }

/* slice_bwd(dy, axis, start, size): dy placed at [start, start + len) along the axis of
 * zeros whose axis is size long (the sliced input's shape). */
int shape_slice_bwd(ShapeCtx *c)
{
    if (want_in(c, 1)) return -1;
    const OpType *dy = &c->in[0];
    int64_t axis = op_attr_int(&c->attrs, "axis", 0), start = op_attr_int(&c->attrs, "start", 0),
            size = op_attr_int(&c->attrs, "size", 0);
    char t[192];
    if (axis < 0) axis += dy->rank;
    if (axis < 0 || axis >= dy->rank || start < 0 || start + dy->shape[axis] > size)
        return shape_fail(c, "slice_bwd: %s at %" PRId64 " along axis %" PRId64 " does not fit in %" PRId64,
                          op_type_str(dy, t, sizeof t), start, axis, size);
    like(c, 0, dy);
    c->out[0].shape[axis] = size;
    return 0;
}

/* (q, k, v, o, lse, dout) -> dq, dk, dv */
int shape_attention_bwd(ShapeCtx *c)
{
    if (want_in(c, 6)) return -1;
    for (int i = 0; i < 3; i++) like(c, i, &c->in[i]);
    return 0;
}

/* (q, k, v, mask, o, lse, dout) -> dq, dk, dv */
int shape_attention_masked_bwd(ShapeCtx *c)
{
    if (want_in(c, 7)) return -1;
    for (int i = 0; i < 3; i++) like(c, i, &c->in[i]);
    return 0;
}

/* (qkv, mask, o, lse, dout) -> dqkv, laid out as qkv */
int shape_attention_qkv_masked_bwd(ShapeCtx *c)
{
    if (want_in(c, 5)) return -1;
    like(c, 0, &c->in[0]);
    return 0;
}

/* (qkv, o, lse, dout) -> dqkv, laid out as qkv */
int shape_attention_qkv_bwd(ShapeCtx *c)
{
    if (want_in(c, 4)) return -1;
    like(c, 0, &c->in[0]);
    return 0;
}

/* (q, k, v, o, lse, dout) -> dq, dk, dv, each laid out as its input */
int shape_attention_rows_bwd(ShapeCtx *c)
{
    if (want_in(c, 6)) return -1;
    for (int i = 0; i < 3; i++) like(c, i, &c->in[i]);
    return 0;
}

/* ---- optimizer --------------------------------------------------------------------- */

/* sumsq_parts(x) -> f32 [ceil(numel / OPS_SUMSQ_CHUNK)], at least one part. */
int shape_sumsq_parts(ShapeCtx *c)
{
    if (want_in(c, 1)) return -1;
    if (c->in[0].dtype == DT_I32) return shape_fail(c, "sumsq_parts: x must be a float tensor");
    int64_t n = 1;
    for (int d = 0; d < c->in[0].rank; d++) n *= c->in[0].shape[d];
    int64_t parts = n > 0 ? (n + OPS_SUMSQ_CHUNK - 1) / OPS_SUMSQ_CHUNK : 1;
    shape_set(c, 0, DT_F32, 1, &parts);
    return 0;
}

/* sum_parts(*xs f32) -> f32 []: every element of every input, in order. */
int shape_sum_parts(ShapeCtx *c)
{
    if (c->n_in < 1) return shape_fail(c, "sum_parts: expects at least 1 tensor, got 0");
    for (int i = 0; i < c->n_in; i++)
        if (c->in[i].dtype != DT_F32) return shape_fail(c, "sum_parts: input %d is not f32", i);
    shape_set(c, 0, DT_F32, 0, NULL);
    return 0;
}

int shape_lr_at(ShapeCtx *c)
{
    if (want_in(c, 1)) return -1;
    shape_set(c, 0, DT_F32, 0, NULL);
    return 0;
}

int shape_clip_coef(ShapeCtx *c)
{
    if (want_in(c, 1)) return -1;
    shape_set(c, 0, DT_F32, 0, NULL);
    return 0;
}

/* target_count(targets i32 [...]; ignore_index): the targets that are not ignore_index, an f32 []. */
int shape_target_count(ShapeCtx *c)
{
    if (want_in(c, 1)) return -1;
    if (c->in[0].dtype != DT_I32) return shape_fail(c, "target_count: targets must be i32");
    if (!ops_ignores(op_attr_int(&c->attrs, "ignore_index", OPS_NO_IGNORE)))
        return shape_fail(c, "target_count: needs an ignore_index inside i32");
    shape_set(c, 0, DT_F32, 0, NULL);
    return 0;
}

/* count_step(count i32 [], coef f32 []): count += 1 unless coef is not finite. */
int shape_count_step(ShapeCtx *c)
{
    if (want_in(c, 2)) return -1;
    if (c->in[0].dtype != DT_I32 || c->in[0].rank || c->in[1].rank) return shape_fail(c, "count_step: needs i32 [] and f32 []");
    c->n_out = 0;
    return 0;
}

/* scale_update(norm f32 [], scale f32 [], good i32 []): dynamic loss scaling. */
int shape_scale_update(ShapeCtx *c)
{
    if (want_in(c, 3)) return -1;
    if (c->in[0].rank || c->in[1].rank || c->in[2].rank || c->in[2].dtype != DT_I32)
        return shape_fail(c, "scale_update: needs f32 [], f32 [] and i32 []");
    c->n_out = 0;
    return 0;
}

/* In-place updates: the state tensors must match the param; nothing is produced. */
static int update(ShapeCtx *c, int n_in, int n_state)
{
    if (want_in(c, n_in)) return -1;
    char a[192], b[192];
    for (int i = 1; i < n_state; i++)
        if (!op_type_same_shape(&c->in[0], &c->in[i]))
            return shape_fail(c, "%s: %s and %s differ", op_name(c->op), op_type_str(&c->in[0], a, sizeof a),
                              op_type_str(&c->in[i], b, sizeof b));
    c->n_out = 0;
    return 0;
}

int shape_adamw(ShapeCtx *c) { return update(c, 7, 4); }
int shape_sgd(ShapeCtx *c) { return update(c, 6, 3); }

/* The update, and w (its last tensor): p's 16-bit working copy, as many elements. */
static int update_cast(ShapeCtx *c, int n_in, int n_state)
{
    if (update(c, n_in, n_state)) return -1;
    const OpType *w = &c->in[n_in - 1];
    char a[192], b[192];
    if ((w->dtype != DT_F16 && w->dtype != DT_BF16) || op_type_numel(w) != op_type_numel(&c->in[0]))
        return shape_fail(c, "%s: w must be a 16-bit copy of p: %s for %s", op_name(c->op), op_type_str(w, a, sizeof a),
                          op_type_str(&c->in[0], b, sizeof b));
    return 0;
}
int shape_adamw_cast(ShapeCtx *c) { return update_cast(c, 8, 4); }
int shape_sgd_cast(ShapeCtx *c) { return update_cast(c, 7, 3); }

/* ---- communication and copies ---------------------------------------------------------- */

int shape_copy(ShapeCtx *c)
{
    if (want_in(c, 1)) return -1;
    like(c, 0, &c->in[0]);
    return 0;
}
/* to_host, to_device: the same tensor, in the other memory space. */
int shape_to_host(ShapeCtx *c) { return shape_copy(c); }
int shape_to_device(ShapeCtx *c) { return shape_copy(c); }

static int64_t world_of(ShapeCtx *c) { return op_attr_int(&c->attrs, "world", 0); }

int shape_all_reduce(ShapeCtx *c)
{
    if (want_in(c, 1)) return -1;
    if (world_of(c) < 1) return shape_fail(c, "all_reduce: world must be positive");
    like(c, 0, &c->in[0]);
    return 0;
}

/* Flat buffers: [n * world] -> [n], each rank keeps its n. */
int shape_reduce_scatter(ShapeCtx *c)
{
    if (want_in(c, 1)) return -1;
    int64_t w = world_of(c), n = op_type_numel(&c->in[0]);
    if (w < 1 || c->in[0].rank != 1 || n % w)
        return shape_fail(c, "reduce_scatter: a flat buffer of %" PRId64 " elements does not split over %" PRId64 " ranks", n, w);
    int64_t s = n / w;
    shape_set(c, 0, c->in[0].dtype, 1, &s);
    return 0;
}

/* [n] on each rank -> [n * world], rank r's part at r * n. */
int shape_all_gather(ShapeCtx *c)
{
    if (want_in(c, 1)) return -1;
    int64_t w = world_of(c);
    if (w < 1 || c->in[0].rank != 1) return shape_fail(c, "all_gather: needs a flat buffer and a positive world");
    int64_t s = op_type_numel(&c->in[0]) * w;
    shape_set(c, 0, c->in[0].dtype, 1, &s);
    return 0;
}

/* cast(x, to): x's shape in DType `to` (f32, f16, bf16: round to nearest even). */
int shape_cast(ShapeCtx *c)
{
    if (want_in(c, 1)) return -1;
    int64_t to = op_attr_int(&c->attrs, "to", 0);
    char t[192];
    if (to < 0 || to >= DT_COUNT || !dtype_is_float((DType)to) || !dtype_is_float(c->in[0].dtype))
        return shape_fail(c, "cast: %s to dtype %ld: only float dtypes convert", op_type_str(&c->in[0], t, sizeof t), (long)to);
    like(c, 0, &c->in[0]);
    c->out[0].dtype = (DType)to;
    return 0;
}

/* send(x, peer): x to stage `peer`; nothing comes out. */
int shape_send(ShapeCtx *c)
{
    if (want_in(c, 1)) return -1;
    if (op_attr_int(&c->attrs, "peer", -1) < 0) return shape_fail(c, "send: peer must be a stage, >= 0");
    c->n_out = 0;
    return 0;
}

/* recv(shape, dtype, peer): a tensor of that type from stage `peer`. */
int shape_recv(ShapeCtx *c)
{
    if (want_in(c, 0)) return -1;
    int64_t dt = op_attr_int(&c->attrs, "dtype", -1);
    if (dt < 0 || dt >= DT_COUNT) return shape_fail(c, "recv: dtype %" PRId64 " out of range", dt);
    if (op_attr_int(&c->attrs, "peer", -1) < 0) return shape_fail(c, "recv: peer must be a stage, >= 0");
    return shape_attr(c, (DType)dt);
}

/* pad(x, axis, start, size): slice_bwd's rule (passes/pad_vocab.c's padded head copy). */
int shape_pad(ShapeCtx *c) { return shape_slice_bwd(c); }
