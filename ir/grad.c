/* ir/grad.c: the gradient rule of every differentiable op (grad_NAME, named by the grad
 * column of ops/ops.def). A rule reads the forward node and the gradients of its outputs
 * and emits backward nodes (phase backward, the forward node's block and source loc)
 * whose outputs are the gradients of its inputs. Rules skip inputs that need no
 * gradient, and pass a gradient through without a node where the math allows (add).
 *
 * Broadcasting is undone with sum_to, so every input gradient has its input's shape.
 * Where it sits: passes/autodiff.c calls the rules in reverse order of the forward nodes.
 */
#include <string.h>

#include "ir.h"

static Attr aint(const char *key, int64_t v) { return (Attr){.key = key, .kind = ATTR_INT, .i = v}; }
static Attr afloat(const char *key, double v) { return (Attr){.key = key, .kind = ATTR_FLOAT, .f = v}; }
static Attr aints(const char *key, const int64_t *v, int n)
{
    return (Attr){.key = key, .kind = ATTR_INTS, .ints = v, .n_list = n};
}

/* Emits a backward node; its shape rule failing would be a bug in a gradient rule. */
static int emit_node(GradCtx *c, OpKind op, const int *in, int n_in, const Attr *attrs, int n_attr)
{
    const Node *fwd = ir_node(c->g, c->node);
    char err[256];
    int id = ir_node_add(c->g, op, in, n_in, attrs, n_attr, fwd->block, PHASE_BACKWARD, fwd->loc, err, sizeof err);
    if (id < 0) fprintf(stderr, "gradient of %s: %s\n", op_name(fwd->op), err);
    FS_ASSERT(id >= 0);
    return id;
}

/* The first output of a new node: most backward ops have one. */
static int emit(GradCtx *c, OpKind op, const int *in, int n_in, const Attr *attrs, int n_attr)
{
    int id = emit_node(c, op, in, n_in, attrs, n_attr);
    return ir_out(c->g, ir_node(c->g, id), 0);
}

static int emit1(GradCtx *c, OpKind op, int a) { return emit(c, op, &a, 1, NULL, 0); }
static int emit2(GradCtx *c, OpKind op, int a, int b) { return emit(c, op, (int[]){a, b}, 2, NULL, 0); }

static const Value *val(const GradCtx *c, int id) { return ir_value(c->g, id); }
static int in_of(const GradCtx *c, int i) { return ir_in(c->g, ir_node(c->g, c->node), i); }
static int out_of(const GradCtx *c, int i) { return ir_out(c->g, ir_node(c->g, c->node), i); }
static int64_t attr_i(const GradCtx *c, const char *key) { return ir_attr_int(c->g, ir_node(c->g, c->node), key, 0); }
static double attr_f(const GradCtx *c, const char *key) { return ir_attr_float(c->g, ir_node(c->g, c->node), key, 0); }

/* g reduced to the shape of value `like` (undoing broadcasting). */
static int sum_to(GradCtx *c, int g, int like)
{
    const Value *l = val(c, like);
    if (ir_same_shape(val(c, g), l)) return g;
    int64_t shape[IR_MAX_RANK];
    memcpy(shape, l->shape, sizeof shape);
    Attr a = aints("shape", shape, l->rank);
    return emit(c, OP_sum_to, &g, 1, &a, 1);
}

static int reshape_to(GradCtx *c, int g, const int64_t *shape, int rank)
{
    Attr a = aints("shape", shape, rank);
    return emit(c, OP_reshape, &g, 1, &a, 1);
}

/* The constant v as a [] of dtype dt: after the precision pass a gradient may be 16-bit,
 * and an elementwise op takes operands of one dtype. */
static int scalar(GradCtx *c, double v, DType dt)
{
    Attr a[3] = {afloat("value", v), aints("shape", NULL, 0), aint("dtype", dt)};
    return emit(c, OP_full, NULL, 0, a, 3);
}

int grad_none(GradCtx *c)
{
    (void)c;
    return 0;
}

/* ---- elementwise -------------------------------------------------------------------- */

int grad_add(GradCtx *c)
{
    for (int i = 0; i < 2; i++)
        if (c->need[i]) c->din[i] = sum_to(c, c->dout[0], in_of(c, i));
    return 0;
}

int grad_sub(GradCtx *c)
{
    if (c->need[0]) c->din[0] = sum_to(c, c->dout[0], in_of(c, 0));
    if (c->need[1]) c->din[1] = sum_to(c, emit1(c, OP_neg, c->dout[0]), in_of(c, 1));
    return 0;
}

int grad_mul(GradCtx *c)
{
    for (int i = 0; i < 2; i++)
        if (c->need[i]) c->din[i] = sum_to(c, emit2(c, OP_mul, c->dout[0], in_of(c, 1 - i)), in_of(c, i));
    return 0;
}

/* y = a / b: da = dy / b, db = -dy * y / b. */
int grad_div(GradCtx *c)
{
    int dy = c->dout[0], b = in_of(c, 1);
    if (c->need[0]) c->din[0] = sum_to(c, emit2(c, OP_div, dy, b), in_of(c, 0));
    if (c->need[1]) {
        int t = emit2(c, OP_div, emit2(c, OP_mul, dy, out_of(c, 0)), b);
        c->din[1] = sum_to(c, emit1(c, OP_neg, t), b);
    }
    return 0;
}

int grad_neg(GradCtx *c) { return c->din[0] = emit1(c, OP_neg, c->dout[0]), 0; }
int grad_exp(GradCtx *c) { return c->din[0] = emit2(c, OP_mul, c->dout[0], out_of(c, 0)), 0; }
int grad_log(GradCtx *c) { return c->din[0] = emit2(c, OP_div, c->dout[0], in_of(c, 0)), 0; }
/* Rules whose backward op reads the output (y) or the input (x), and dy. */
int grad_sqrt(GradCtx *c) { return c->din[0] = emit2(c, OP_sqrt_bwd, out_of(c, 0), c->dout[0]), 0; }
int grad_rsqrt(GradCtx *c) { return c->din[0] = emit2(c, OP_rsqrt_bwd, out_of(c, 0), c->dout[0]), 0; }
int grad_tanh(GradCtx *c) { return c->din[0] = emit2(c, OP_tanh_bwd, out_of(c, 0), c->dout[0]), 0; }
int grad_sigmoid(GradCtx *c) { return c->din[0] = emit2(c, OP_sigmoid_bwd, out_of(c, 0), c->dout[0]), 0; }
int grad_relu(GradCtx *c) { return c->din[0] = emit2(c, OP_relu_bwd, in_of(c, 0), c->dout[0]), 0; }
int grad_gelu(GradCtx *c)
{
    Attr at = aint("exact", attr_i(c, "exact"));
    c->din[0] = emit(c, OP_gelu_bwd, (int[]){in_of(c, 0), c->dout[0]}, 2, &at, 1);
    return 0;
}
int grad_silu(GradCtx *c) { return c->din[0] = emit2(c, OP_silu_bwd, in_of(c, 0), c->dout[0]), 0; }
/* y = x ** p: dx = dy p x ** (p - 1), in one op that reads x (pow_bwd). */
int grad_pow(GradCtx *c)
{
    Attr at = afloat("p", attr_f(c, "p"));
    c->din[0] = emit(c, OP_pow_bwd, (int[]){in_of(c, 0), c->dout[0]}, 2, &at, 1);
    return 0;
}
/* Dropout's backward is dropout of dy under the same key (the same attributes and rng):
 * it regenerates the forward's mask, so nothing is saved for it, not even x. */
int grad_dropout(GradCtx *c)
{
    const Node *fwd = ir_node(c->g, c->node);
    Attr at[IR_MAX_PARAMS];
    ir_node_attrs(c->g, fwd, at);
    return c->din[0] = emit(c, OP_dropout, (int[]){c->dout[0], in_of(c, 1)}, 2, at, fwd->n_attr), 0;
}

/* ---- matmul ------------------------------------------------------------------------ */

static int matmul(GradCtx *c, int a, int b, int ta, int tb)
{
    Attr at[2] = {aint("ta", ta), aint("tb", tb)};
    return emit(c, OP_matmul, (int[]){a, b}, 2, at, 2);
}

/* The shape of v with a 1 inserted at position `at` (negative: from the end). */
static int unsqueeze(GradCtx *c, int v, int at)
{
    const Value *x = val(c, v);
    int64_t s[IR_MAX_RANK];
    int r = x->rank + 1, pos = at < 0 ? r + at : at;
    for (int i = 0, j = 0; i < r; i++) s[i] = i == pos ? 1 : x->shape[j++];
    return reshape_to(c, v, s, r);
}

/* C = op(A) @ op(B), op transposing the last two dims when ta / tb. A 1-D operand is
 * made 2-D first (a row vector for A, a column for B), as torch.matmul defines it. */
int grad_matmul(GradCtx *c)
{
    int a = in_of(c, 0), b = in_of(c, 1), dc = c->dout[0];
    int ta = (int)attr_i(c, "ta"), tb = (int)attr_i(c, "tb");
    int a1 = val(c, a)->rank == 1, b1 = val(c, b)->rank == 1;
    int a2 = a1 ? unsqueeze(c, a, 0) : a, b2 = b1 ? unsqueeze(c, b, 1) : b;
    if (a1) dc = unsqueeze(c, dc, -2);
    if (b1) dc = unsqueeze(c, dc, -1);
    if (c->need[0]) {
        int d = ta ? matmul(c, b2, dc, tb, 1) : matmul(c, dc, b2, 0, !tb);
        d = sum_to(c, d, a2);
        c->din[0] = a1 ? reshape_to(c, d, val(c, a)->shape, 1) : d;
    }
    if (c->need[1] && !a1 && !b1 && !ta && val(c, b)->rank == 2 && val(c, a)->rank > 2) {
        /* x[B, T, C] @ w[C, N]: flatten the batch into the rows of one GEMM instead of
         * a batched GEMM and a sum over its B results. (Reshapes are views.) */
        const Value *av = val(c, a), *cv = val(c, dc);
        int64_t rows = ir_numel(av) / av->shape[av->rank - 1];
        int64_t sa[2] = {rows, av->shape[av->rank - 1]}, sc[2] = {rows, cv->shape[cv->rank - 1]};
        int af = reshape_to(c, a, sa, 2), cf = reshape_to(c, dc, sc, 2);
        c->din[1] = tb ? matmul(c, cf, af, 1, 0) : matmul(c, af, cf, 1, 0);
    } else if (c->need[1]) {
        int d = tb ? matmul(c, dc, a2, 1, ta) : matmul(c, a2, dc, !ta, 0);
        d = sum_to(c, d, b2);
        c->din[1] = b1 ? reshape_to(c, d, val(c, b)->shape, 1) : d;
    }
    return 0;
}

/* ---- reductions and normalizations --------------------------------------------------- */

/* dy of a reduction over `axis`, broadcast back to x's shape. */
static int expand_back(GradCtx *c, int dy, int x, int axis, int keepdim)
{
    const Value *xv = val(c, x);
    if (axis < 0) axis += xv->rank;
    if (!keepdim) dy = unsqueeze(c, dy, axis);
    int64_t shape[IR_MAX_RANK];
    memcpy(shape, xv->shape, sizeof shape);
    Attr a = aints("shape", shape, xv->rank);
    return emit(c, OP_expand, &dy, 1, &a, 1);
}

int grad_sum(GradCtx *c)
{
    c->din[0] = expand_back(c, c->dout[0], in_of(c, 0), (int)attr_i(c, "axis"), (int)attr_i(c, "keepdim"));
    return 0;
}

int grad_mean(GradCtx *c)
{
    int x = in_of(c, 0), axis = (int)attr_i(c, "axis");
    const Value *xv = val(c, x);
    int64_t n = xv->shape[axis < 0 ? axis + xv->rank : axis];
    int d = expand_back(c, c->dout[0], x, axis, (int)attr_i(c, "keepdim"));
    c->din[0] = emit2(c, OP_mul, d, scalar(c, 1.0 / (double)n, val(c, d)->dtype));
    return 0;
}

int grad_max(GradCtx *c)
{
    Attr at[2] = {aint("axis", attr_i(c, "axis")), aint("keepdim", attr_i(c, "keepdim"))};
    c->din[0] = emit(c, OP_max_bwd, (int[]){in_of(c, 0), c->dout[0]}, 2, at, 2);
    return 0;
}

int grad_softmax(GradCtx *c)
{
    Attr at = aint("axis", attr_i(c, "axis"));
    c->din[0] = emit(c, OP_softmax_bwd, (int[]){out_of(c, 0), c->dout[0]}, 2, &at, 1);
    return 0;
}

/* Emits a multi-output backward op and hands its outputs to the inputs that need them. */
static void route(GradCtx *c, int node, const int *to_input, int n)
{
    for (int i = 0; i < n; i++)
        if (c->need[to_input[i]]) c->din[to_input[i]] = ir_out(c->g, ir_node(c->g, node), i);
}

int grad_layernorm(GradCtx *c)
{
    Attr at = afloat("eps", attr_f(c, "eps"));
    int n = emit_node(c, OP_layernorm_bwd, (int[]){in_of(c, 0), in_of(c, 1), c->dout[0]}, 3, &at, 1);
    route(c, n, (int[]){0, 1, 2}, 3);
    return 0;
}

int grad_rmsnorm(GradCtx *c)
{
    Attr at = afloat("eps", attr_f(c, "eps"));
    int n = emit_node(c, OP_rmsnorm_bwd, (int[]){in_of(c, 0), in_of(c, 1), c->dout[0]}, 3, &at, 1);
    route(c, n, (int[]){0, 1}, 2);
    return 0;
}

int grad_embedding(GradCtx *c)
{
    Attr at = aint("rows", val(c, in_of(c, 0))->shape[0]);
    c->din[0] = emit(c, OP_embedding_bwd, (int[]){in_of(c, 1), c->dout[0]}, 2, &at, 1);
    return 0;
}

int grad_cross_entropy(GradCtx *c)
{
    /* The loss's ignore_index (when it has one) and a padded vocabulary's valid columns (passes/pad_vocab.c),
     * which get no gradient. With an ignore_index, the mean's divisor is the counted targets: counted once, by
     * target_count, and dloss divided by it here (per_row), so no kernel counts them per row; a count of 0
     * leaves every row ignored, whose gradient is 0 whatever the share. passes/xent_count.c makes the divisor the
     * global batch's count when a step has several micro-batches or data-parallel ranks. */
    Attr at[3] = {aint("ignore_index", ir_attr_int(c->g, ir_node(c->g, c->node), "ignore_index", OPS_NO_IGNORE)),
                  aint("valid", attr_i(c, "valid")), aint("per_row", 1)};
    int dl = c->dout[0];
    if (!ops_ignores(at[0].i)) {
        c->din[0] = emit(c, OP_cross_entropy_bwd, (int[]){in_of(c, 0), in_of(c, 1), dl}, 3, &at[1], 1);
        return 0;
    }
    int count = emit(c, OP_target_count, (int[]){in_of(c, 1)}, 1, at, 1);
    dl = emit2(c, OP_div, dl, count);
    c->din[0] = emit(c, OP_cross_entropy_bwd, (int[]){in_of(c, 0), in_of(c, 1), dl}, 3, at, 3);
    return 0;
}

/* ---- layout ------------------------------------------------------------------------- */

int grad_reshape(GradCtx *c)
{
    const Value *x = val(c, in_of(c, 0));
    c->din[0] = reshape_to(c, c->dout[0], x->shape, x->rank);
    return 0;
}

int grad_transpose(GradCtx *c)
{
    Attr at[2] = {aint("a", attr_i(c, "a")), aint("b", attr_i(c, "b"))};
    c->din[0] = emit(c, OP_transpose, &c->dout[0], 1, at, 2);
    return 0;
}

int grad_permute(GradCtx *c)
{
    int n;
    const int64_t *dims = ir_attr_ints(c->g, ir_node(c->g, c->node), "dims", &n);
    int64_t inv[IR_MAX_RANK];
    for (int i = 0; i < n; i++) inv[dims[i] < 0 ? dims[i] + n : dims[i]] = i;
    Attr at = aints("dims", inv, n);
    c->din[0] = emit(c, OP_permute, &c->dout[0], 1, &at, 1);
    return 0;
}

/* Parts without a gradient contribute zeros to the concatenation. */
int grad_split(GradCtx *c)
{
    const Node *n = ir_node(c->g, c->node);
    int parts[IR_MAX_OUT], n_out = n->n_out;
    int64_t axis = attr_i(c, "axis");
    for (int i = 0; i < n_out; i++) {
        parts[i] = c->dout[i];
        if (parts[i] >= 0) continue;
        const Value *o = val(c, out_of(c, i));
        int64_t shape[IR_MAX_RANK];
        memcpy(shape, o->shape, sizeof shape);
        Attr at[3] = {afloat("value", 0), aints("shape", shape, o->rank), aint("dtype", o->dtype)};  // concat takes one dtype
        parts[i] = emit(c, OP_full, NULL, 0, at, 3);
    }
    Attr at = aint("axis", axis);
    c->din[0] = emit(c, OP_concat, parts, n_out, &at, 1);
    return 0;
}

int grad_concat(GradCtx *c)
{
    const Node *n = ir_node(c->g, c->node);
    int n_in = n->n_in;
    const Value *out = val(c, out_of(c, 0));
    int64_t axis = attr_i(c, "axis"), start = 0;
    if (axis < 0) axis += out->rank;
    for (int i = 0; i < n_in; i++) {
        int64_t len = val(c, in_of(c, i))->shape[axis];
        if (c->need[i]) {
            Attr at[3] = {aint("axis", axis), aint("start", start), aint("len", len)};
            c->din[i] = emit(c, OP_slice, &c->dout[0], 1, at, 3);
        }
        start += len;
    }
    return 0;
}

/* op(dout, axis, start, key = the input's length along axis): slice's and pad's adjoints, each the other. */
static int slice_adjoint(GradCtx *c, OpKind op, const char *key)
{
    const Value *x = val(c, in_of(c, 0));
    int64_t axis = attr_i(c, "axis");
    if (axis < 0) axis += x->rank;
    Attr at[3] = {aint("axis", axis), aint("start", attr_i(c, "start")), aint(key, x->shape[axis])};
    c->din[0] = emit(c, op, &c->dout[0], 1, at, 3);
    return 0;
}

/* The slice's rows of a zero tensor of the input's shape. */
int grad_slice(GradCtx *c) { return slice_adjoint(c, OP_slice_bwd, "size"); }

/* A cast's gradient is cast back: fp32 master weights get fp32 gradients. */
int grad_cast(GradCtx *c)
{
    Attr at = aint("to", val(c, in_of(c, 0))->dtype);
    c->din[0] = emit(c, OP_cast, &c->dout[0], 1, &at, 1);
    return 0;
}

int grad_heads(GradCtx *c) { return c->din[0] = emit1(c, OP_merge_heads, c->dout[0]), 0; }

int grad_merge_heads(GradCtx *c)
{
    const Value *x = val(c, in_of(c, 0));
    Attr at = aint("n", x->shape[x->rank - 3]);
    c->din[0] = emit(c, OP_heads, &c->dout[0], 1, &at, 1);
    return 0;
}

/* A rotation's adjoint is the rotation by the opposite angle. */
int grad_rope(GradCtx *c)
{
    Attr at[3] = {afloat("theta", attr_f(c, "theta")), aint("inverse", !attr_i(c, "inverse")),
                  aint("interleaved", attr_i(c, "interleaved"))};
    c->din[0] = emit(c, OP_rope, &c->dout[0], 1, at, 3);
    return 0;
}

/* The row log-sum-exp the forward saved lets backward rebuild the probabilities one row
 * at a time, never the T x T matrix. */
int grad_attention(GradCtx *c)
{
    Attr at = aint("causal", attr_i(c, "causal"));
    int in[6] = {in_of(c, 0), in_of(c, 1), in_of(c, 2), out_of(c, 0), out_of(c, 1), c->dout[0]};
    int n = emit_node(c, OP_attention_bwd, in, 6, &at, 1);
    route(c, n, (int[]){0, 1, 2}, 3);
    return 0;
}

/* attention_masked: attention's rule with the mask passed along. The mask gets no gradient, boolean or
 * additive: a float mask computed from params passes them none through here (PyTorch would). */
int grad_attention_masked(GradCtx *c)
{
    Attr at = aint("causal", attr_i(c, "causal"));
    int in[7] = {in_of(c, 0), in_of(c, 1), in_of(c, 2), in_of(c, 3), out_of(c, 0), out_of(c, 1), c->dout[0]};
    int n = emit_node(c, OP_attention_masked_bwd, in, 7, &at, 1);
    route(c, n, (int[]){0, 1, 2}, 3);
    return 0;
}

/* attention_qkv's rule with attention_masked's mask passed along (it gets no gradient). */
int grad_attention_qkv_masked(GradCtx *c)
{
    Attr at[3] = {aint("nh", attr_i(c, "nh")), aint("nkv", attr_i(c, "nkv")), aint("causal", attr_i(c, "causal"))};
    int in[5] = {in_of(c, 0), in_of(c, 1), out_of(c, 0), out_of(c, 1), c->dout[0]};
    int n = emit_node(c, OP_attention_qkv_masked_bwd, in, 5, at, 3);
    route(c, n, (int[]){0}, 1);
    return 0;
}

/* attention's rule on the packed layout: one gradient, laid out as qkv. */
int grad_attention_qkv(GradCtx *c)
{
    Attr at[3] = {aint("nh", attr_i(c, "nh")), aint("nkv", attr_i(c, "nkv")), aint("causal", attr_i(c, "causal"))};
    int in[4] = {in_of(c, 0), out_of(c, 0), out_of(c, 1), c->dout[0]};
    int n = emit_node(c, OP_attention_qkv_bwd, in, 4, at, 3);
    route(c, n, (int[]){0}, 1);
    return 0;
}

/* rope's rule on the rows' layout: the rotation by the opposite angle, in place of each head. */
int grad_rope_rows(GradCtx *c)
{
    Attr at[4] = {aint("n", attr_i(c, "n")), afloat("theta", attr_f(c, "theta")),
                  aint("inverse", !attr_i(c, "inverse")), aint("interleaved", attr_i(c, "interleaved"))};
    c->din[0] = emit(c, OP_rope_rows, &c->dout[0], 1, at, 4);
    return 0;
}

/* attention's rule on the projections' rows: dq, dk, dv laid out as q, k, v. */
int grad_attention_rows(GradCtx *c)
{
    Attr at[3] = {aint("nh", attr_i(c, "nh")), aint("nkv", attr_i(c, "nkv")), aint("causal", attr_i(c, "causal"))};
    int in[6] = {in_of(c, 0), in_of(c, 1), in_of(c, 2), out_of(c, 0), out_of(c, 1), c->dout[0]};
    int n = emit_node(c, OP_attention_rows_bwd, in, 6, at, 3);
    route(c, n, (int[]){0, 1, 2}, 3);
    return 0;
}

/* pad's adjoint takes x's rows back out of the padded gradient (the padding's gradient is dropped). */
int grad_pad(GradCtx *c) { return slice_adjoint(c, OP_slice, "len"); }
