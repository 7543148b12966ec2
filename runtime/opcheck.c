/* runtime/opcheck.c: every op of a plan against the op table, before any kernel sees it.
 *
 * plan_check (plan/) makes a plan safe to index: ids in range, ranges inside their pools.
 * It cannot know what an op means. This file does, from the op table the runtime shares
 * with the compiler (ops/ops.def, the op layer fs_ops): for each op
 *   - its name is in the table and has a CPU kernel;
 *   - its inputs and outputs count as the signature says (and fit the kernel ABI);
 *   - every attribute is a key of the signature, given once, of its kind (ints and
 *     flags as integers that fit an int, flags 0 or 1), and the required ones are there;
 *   - every tensor it touches has dims >= 1 (kernels divide by them), and GEMM operands
 *     dims that fit cblas's ints;
 *   - the op's shape rule (ops/shape.c, ops/shape_bwd.c: the one the compiler ran when
 *     it made the node), run on the plan's input dtypes, shapes and attributes, accepts
 *     it and infers exactly the plan's outputs;
 *   - where a kernel asks more than the rule (the rules of compiler-made ops trust their
 *     maker), what it asks: the forward op's rule over a backward op's inputs, f32 for
 *     the optimizer, i32 step counts, a collective's world equal to the plan's.
 * Then opcheck_mem.c checks the memory plan and the values kernels index with. After
 * rt_plan_check_ops passes, no op reaches a kernel whose KCHECK it could trip.
 *
 * The shape rules read OpTypes and an attribute accessor (ops/ops.h); here the accessor
 * reads the plan op's attributes where they are, so nothing is copied or allocated.
 *
 * Where it sits: called by rt_exec_new and wherever a plan is accepted (fsexec's load),
 * after plan_read; it needs the op table (fs_ops), never the IR.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ops.h"
#include "kernels.h"
#include "runtime.h"

/* The plan's dtypes are what the shape rules call them. */
_Static_assert((int)PLAN_DT_F32 == (int)DT_F32 && (int)PLAN_DT_F16 == (int)DT_F16 && (int)PLAN_DT_BF16 == (int)DT_BF16 &&
                   (int)PLAN_DT_I32 == (int)DT_I32 && (int)PLAN_DT_COUNT == (int)DT_COUNT,
               "PlanDType and DType number dtypes alike");

typedef struct {
    const Plan *p;
    int32_t k;                   // the op being checked
    const PlanOp *op;
    const char *name;
    OpKind kind;
    const OpInfo *info;
    int64_t world;               // the program's data-parallel ranks (dp_world)
    int64_t stages;              // the stages of the plan it is a program of; 0: not known
    OpAttrs attrs;               // the op's attributes, as the shape rules read them
    OpType in[OPS_MAX_IN];       // the inputs' types
    char *err;
    size_t errlen;
} OpCheck;

__attribute__((format(printf, 2, 3))) static int fail(OpCheck *c, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return plan_fail(c->err, c->errlen, "op %d (%s): %s", c->k, c->name, msg);
}

static int32_t in_id(const OpCheck *c, int i) { return c->p->ids[c->op->in + i]; }
static int32_t out_id(const OpCheck *c, int i) { return c->p->ids[c->op->out + i]; }
static const PlanTensor *in_t(const OpCheck *c, int i) { return &c->p->tensors[in_id(c, i)]; }
static const PlanTensor *out_t(const OpCheck *c, int i) { return &c->p->tensors[out_id(c, i)]; }

static OpType type_of(const PlanTensor *t)
{
    OpType v = {.dtype = (DType)t->dtype, .rank = t->rank};
    for (int d = 0; d < t->rank; d++) v.shape[d] = t->shape[d];
    return v;
}

/* The OpAttrs accessor: attribute `key` of the op being checked, read from the plan. */
static int find_attr(const void *self, const char *key, OpAttr *out)
{
    const OpCheck *c = self;
    for (int32_t a = 0; a < c->op->n_attr; a++) {
        const PlanAttr *at = &c->p->attrs[c->op->attr + a];
        if (strcmp(plan_str(c->p, at->key), key)) continue;
        int list = at->kind == PLAN_ATTR_INTS;
        *out = (OpAttr){.kind = at->kind == PLAN_ATTR_INT ? OPA_INT : at->kind == PLAN_ATTR_FLOAT ? OPA_FLOAT : OPA_INTS,
                        .i = at->i, .f = at->f, .ints = list ? &c->p->ints[at->list] : NULL, .n_ints = list ? at->n_list : 0};
        return 1;
    }
    return 0;
}

/* "tensor 12 'h.0.attn.w' (f32[64, 192])" into buf. */
static const char *describe(const OpCheck *c, int32_t id, char *buf, size_t n)
{
    OpType v = type_of(&c->p->tensors[id]);
    char type[192];
    const char *name = plan_str(c->p, c->p->tensors[id].name);
    snprintf(buf, n, "tensor %d%s%s%s (%s)", id, *name ? " '" : "", name, *name ? "'" : "",
             op_type_str(&v, type, sizeof type));
    return buf;
}

static int same_type(const OpType *v, const PlanTensor *t)
{
    if ((int)v->dtype != (int)t->dtype || v->rank != t->rank) return 0;
    for (int d = 0; d < v->rank; d++)
        if (v->shape[d] != t->shape[d]) return 0;
    return 1;
}

/* ---- the table: name, kernel, arity --------------------------------------------------- */

static int check_arity(OpCheck *c)
{
    const OpInfo *info = c->info;
    int n_in = c->op->n_in, n_out = c->op->n_out;
    int in_ok = info->n_tensors >= 0 ? n_in == info->n_tensors : n_in >= 1 && n_in <= OPS_MAX_IN;
    int out_ok = info->n_out >= 0 ? n_out == info->n_out : n_out >= 1 && n_out <= OPS_MAX_OUT;
    if (!in_ok || !out_ok) {
        char want_in[32], want_out[32];
        if (info->n_tensors >= 0) snprintf(want_in, sizeof want_in, "%d", info->n_tensors);
        else snprintf(want_in, sizeof want_in, "1 to %d", OPS_MAX_IN);
        if (info->n_out >= 0) snprintf(want_out, sizeof want_out, "%d", info->n_out);
        else snprintf(want_out, sizeof want_out, "1 to %d", OPS_MAX_OUT);
        return fail(c, "%d input%s and %d output%s, but the op table's \"%s\" takes %s input(s) and %s output(s)", n_in,
                    n_in == 1 ? "" : "s", n_out, n_out == 1 ? "" : "s", info->sig, want_in, want_out);
    }
    if (n_in > K_MAX_TENSORS || n_out > K_MAX_TENSORS || info->n_params > K_MAX_ATTRS)
        return fail(c, "%d inputs, %d outputs, %d signature parameters; the CPU kernel ABI takes %d, %d, %d", n_in, n_out,
                    info->n_params, K_MAX_TENSORS, K_MAX_TENSORS, K_MAX_ATTRS);
    return 0;
}

/* Kernels divide by dims (rows = numel / C) and pass GEMM sizes to cblas as ints. */
static int check_dims(OpCheck *c)
{
    int gemm = c->kind == OP_matmul || c->kind == OP_attention || c->kind == OP_attention_bwd ||
               c->kind == OP_attention_qkv || c->kind == OP_attention_qkv_bwd || c->kind == OP_attention_masked ||
               c->kind == OP_attention_masked_bwd || c->kind == OP_attention_qkv_masked ||
               c->kind == OP_attention_qkv_masked_bwd || c->kind == OP_attention_rows ||
               c->kind == OP_attention_rows_bwd;
    for (int i = 0; i < c->op->n_in + c->op->n_out; i++) {
        int32_t id = i < c->op->n_in ? in_id(c, i) : out_id(c, i - c->op->n_in);
        const PlanTensor *t = &c->p->tensors[id];
        for (int d = 0; d < t->rank; d++) {
            char what[256];
            if (t->shape[d] < 1)
                return fail(c, "%s %d, %s, has a dim of %" PRId64 " (every dim must be at least 1)",
                            i < c->op->n_in ? "input" : "output", i < c->op->n_in ? i : i - c->op->n_in,
                            describe(c, id, what, sizeof what), t->shape[d]);
            if (gemm && t->shape[d] > INT32_MAX)
                return fail(c, "%s: dim %d is %" PRId64 ", more than a GEMM's int can hold",
                            describe(c, id, what, sizeof what), d, t->shape[d]);
        }
    }
    /* matmul folds a's batch into M: that product must fit too. */
    if (c->kind == OP_matmul && in_t(c, 0)->rank >= 1) {
        const PlanTensor *a = in_t(c, 0);
        if (plan_tensor_numel(a) / a->shape[a->rank - 1] > INT32_MAX)
            return fail(c, "input 0 has %" PRId64 " rows, more than a GEMM's int can hold",
                        plan_tensor_numel(a) / a->shape[a->rank - 1]);
    }
    return 0;
}

/* ---- attributes ------------------------------------------------------------------------ */

/* Every attribute a key of the signature, once, of its kind; the required ones present.
 * Kernels cast ints and flags to int (k_int), so they must fit one. */
static int check_attrs(OpCheck *c)
{
    const Plan *p = c->p;
    int seen[OPS_MAX_PARAMS] = {0}, lists = 0;
    for (int32_t a = 0; a < c->op->n_attr; a++) {
        const PlanAttr *at = &p->attrs[c->op->attr + a];
        const char *key = plan_str(p, at->key);
        int i = op_param_index(c->info, key);
        if (i < 0)
            return fail(c, "attribute '%s' is not in this fsexec's signature \"%s\"; rebuild fsexec or recompile the plan",
                        key, c->info->sig);
        if (seen[i]++) return fail(c, "attribute '%s' is given twice", key);
        ArgKind kind = c->info->params[i].kind;
        if (kind == ARG_INTS && at->kind != PLAN_ATTR_INTS) return fail(c, "attribute '%s' should be a list", key);
        if (kind == ARG_FLOAT && at->kind == PLAN_ATTR_INTS)
            return fail(c, "attribute '%s' should be a number, not a list", key);
        if ((kind == ARG_INT || kind == ARG_FLAG) && at->kind != PLAN_ATTR_INT)
            return fail(c, "attribute '%s' should be an integer", key);
        if (kind == ARG_FLAG && at->i != 0 && at->i != 1)
            return fail(c, "flag '%s' is %" PRId64 ", not 0 or 1", key, at->i);
        if (kind == ARG_INT && (at->i < INT32_MIN || at->i > INT32_MAX) && (double)at->i != c->info->params[i].def)
            return fail(c, "attribute '%s' is %" PRId64 ", outside the int range kernels read", key, at->i);
        lists += at->kind == PLAN_ATTR_INTS;
    }
    if (lists > 1) return fail(c, "two list attributes; the CPU kernel ABI takes one");
    for (int i = 0; i < c->info->n_params; i++) {
        const OpParam *pr = &c->info->params[i];
        if (pr->kind != ARG_TENSOR && pr->kind != ARG_TENSORS && !pr->has_default && !seen[i])
            return fail(c, "attribute '%s' is missing", pr->name);
    }
    return 0;
}

static int64_t attr_int(const OpCheck *c, const char *key, int64_t def) { return op_attr_int(&c->attrs, key, def); }
static double attr_float(const OpCheck *c, const char *key, double def) { return op_attr_float(&c->attrs, key, def); }

/* ---- shape rules ----------------------------------------------------------------------- */

/* Runs op `as`'s shape rule on `in` with this op's attributes; fails with its message. */
static int run_rule(OpCheck *c, OpKind as, const OpType *in, int n_in, ShapeCtx *sc)
{
    char why[512] = "";
    *sc = (ShapeCtx){.op = as, .attrs = c->attrs, .n_in = n_in, .err = why, .errlen = sizeof why};
    for (int i = 0; i < n_in; i++) sc->in[i] = in[i];
    int rc = op_shape(sc);
    sc->err = NULL, sc->errlen = 0;  // why is gone when this returns
    if (rc == 0) return 0;
    /* The rule names its op; say it once when it is this op's own rule. */
    size_t n = strlen(c->name);
    const char *msg = as == c->kind && !strncmp(why, c->name, n) && !strncmp(why + n, ": ", 2) ? why + n + 2 : why;
    return fail(c, "%s", msg);
}

static int check_outputs(OpCheck *c, const ShapeCtx *sc)
{
    if (sc->n_out != c->op->n_out)
        return fail(c, "%d outputs, but the shape rule makes %d", c->op->n_out, sc->n_out);
    for (int i = 0; i < sc->n_out; i++) {
        if (same_type(&sc->out[i], out_t(c, i))) continue;
        char got[256], want[192];
        return fail(c, "output %d, %s, should be %s by the shape rule", i, describe(c, out_id(c, i), got, sizeof got),
                    op_type_str(&sc->out[i], want, sizeof want));
    }
    return 0;
}

/* ---- what kernels ask beyond the shape rules -------------------------------------------- */

static int want_dtype(OpCheck *c, int i, PlanDType dt, int rank)
{
    const PlanTensor *t = in_t(c, i);
    if (t->dtype == dt && (rank < 0 || t->rank == rank)) return 0;
    char what[256];
    return fail(c, "input %d, %s, should be %s%s", i, describe(c, in_id(c, i), what, sizeof what),
                plan_dtype_name(dt), rank == 0 ? " []" : "");
}

static int want_float(OpCheck *c, int i)
{
    if (in_t(c, i)->dtype != PLAN_DT_I32) return 0;
    char what[256];
    return fail(c, "input %d, %s, should be a float tensor", i, describe(c, in_id(c, i), what, sizeof what));
}

static int want_float_inputs(OpCheck *c, int n)
{
    for (int i = 0; i < n; i++)
        if (want_float(c, i)) return -1;
    return 0;
}

/* Input i must be typed as the forward rule's output `v`. */
static int want_like(OpCheck *c, int i, const OpType *v, const char *role)
{
    if (same_type(v, in_t(c, i))) return 0;
    char what[256], want[192];
    return fail(c, "input %d (%s), %s, should be %s", i, role, describe(c, in_id(c, i), what, sizeof what),
                op_type_str(v, want, sizeof want));
}

static int extra_float2(OpCheck *c) { return want_float_inputs(c, 2); }
static int extra_float1(OpCheck *c) { return want_float_inputs(c, 1); }

/* max_bwd(x, dy; axis, keepdim): dy is what max(x; axis, keepdim) makes. */
static int extra_max_bwd(OpCheck *c)
{
    ShapeCtx sc;
    const OpType x[] = {c->in[0]};
    return run_rule(c, OP_max, x, 1, &sc) || want_like(c, 1, &sc.out[0], "dy");
}

/* softmax_bwd(y, dy; axis): y is a softmax's output along axis. */
static int extra_softmax_bwd(OpCheck *c)
{
    ShapeCtx sc;
    const OpType y[] = {c->in[0]};
    return run_rule(c, OP_softmax, y, 1, &sc) || want_like(c, 1, &sc.out[0], "dy");
}

/* layernorm_bwd(x, w, dy; eps): x and w as layernorm takes them (w doubles as the bias). */
static int extra_layernorm_bwd(OpCheck *c)
{
    ShapeCtx sc;
    const OpType in[] = {c->in[0], c->in[1], c->in[1]};
    return run_rule(c, OP_layernorm, in, 3, &sc) || want_like(c, 2, &sc.out[0], "dy");
}

static int extra_rmsnorm_bwd(OpCheck *c)
{
    ShapeCtx sc;
    const OpType in[] = {c->in[0], c->in[1]};
    return run_rule(c, OP_rmsnorm, in, 2, &sc) || want_like(c, 2, &sc.out[0], "dy");
}

/* embedding_bwd(idx, dy; rows): dy is what embedding makes of a [rows, C] table. */
static int extra_embedding_bwd(OpCheck *c)
{
    const OpType *dy = &c->in[1];
    OpType table = {.dtype = dy->dtype, .rank = 2, .shape = {attr_int(c, "rows", 0), dy->shape[dy->rank - 1]}};
    ShapeCtx sc;
    const OpType in[] = {table, c->in[0]};
    return run_rule(c, OP_embedding, in, 2, &sc) || want_like(c, 1, &sc.out[0], "dy");
}

/* cross_entropy_bwd(logits, targets, dloss): as cross_entropy takes them; dloss a float. */
static int extra_cross_entropy_bwd(OpCheck *c)
{
    ShapeCtx sc;
    const OpType in[] = {c->in[0], c->in[1]};
    if (run_rule(c, OP_cross_entropy, in, 2, &sc)) return -1;
    const PlanTensor *g = in_t(c, 2);
    if (g->dtype == PLAN_DT_I32 || plan_tensor_numel(g) != 1) {
        char what[256];
        return fail(c, "input 2 (dloss), %s, should be a float scalar", describe(c, in_id(c, 2), what, sizeof what));
    }
    return 0;
}

/* attention_bwd(q, k, v, o, lse, dout; causal): o, lse as attention(q, k, v) makes them. */
static int extra_attention_bwd(OpCheck *c)
{
    ShapeCtx sc;
    const OpType in[] = {c->in[0], c->in[1], c->in[2]};
    return run_rule(c, OP_attention, in, 3, &sc) || want_like(c, 3, &sc.out[0], "o") ||
           want_like(c, 4, &sc.out[1], "lse") || want_like(c, 5, &sc.out[0], "dout");
}

/* attention_qkv_bwd(qkv, o, lse, dout; nh, nkv, causal): o, lse as attention_qkv(qkv) makes them. */
static int extra_attention_qkv_bwd(OpCheck *c)
{
    ShapeCtx sc;
    return run_rule(c, OP_attention_qkv, c->in, 1, &sc) || want_like(c, 1, &sc.out[0], "o") ||
           want_like(c, 2, &sc.out[1], "lse") || want_like(c, 3, &sc.out[0], "dout");
}

/* attention_qkv_masked_bwd(qkv, mask, o, lse, dout; nh, nkv, causal): o, lse as attention_qkv_masked makes them. */
static int extra_attention_qkv_masked_bwd(OpCheck *c)
{
    ShapeCtx sc;
    return run_rule(c, OP_attention_qkv_masked, c->in, 2, &sc) || want_like(c, 2, &sc.out[0], "o") ||
           want_like(c, 3, &sc.out[1], "lse") || want_like(c, 4, &sc.out[0], "dout");
}

/* attention_rows_bwd(q, k, v, o, lse, dout; nh, nkv, causal): o, lse as attention_rows(q, k, v) makes them. */
static int extra_attention_rows_bwd(OpCheck *c)
{
    ShapeCtx sc;
    return run_rule(c, OP_attention_rows, c->in, 3, &sc) || want_like(c, 3, &sc.out[0], "o") ||
           want_like(c, 4, &sc.out[1], "lse") || want_like(c, 5, &sc.out[0], "dout");
}

/* lr_at(step; lr, schedule, ...): the step an i32 scalar; schedule 0 (constant) or 1 (cosine). */
static int extra_lr_at(OpCheck *c)
{
    if (want_dtype(c, 0, PLAN_DT_I32, 0)) return -1;
    int64_t s = attr_int(c, "schedule", 0);
    if (s < 0 || s >= OPS_LR_COUNT)
        return fail(c, "schedule %" PRId64 " is none of 0 (constant), 1 (cosine), 2 (linear), 3 (wsd)", s);
    double f = attr_float(c, "decay_frac", 0.2);
    if (!(f >= 0 && f <= 1)) return fail(c, "decay_frac %g is outside [0, 1]", f);
    return 0;
}

static int extra_clip_coef(OpCheck *c) { return want_dtype(c, 0, PLAN_DT_F32, 0); }
static int extra_count_step(OpCheck *c) { return want_dtype(c, 1, PLAN_DT_F32, 0); }
static int extra_scale_update(OpCheck *c) { return want_dtype(c, 0, PLAN_DT_F32, 0) || want_dtype(c, 1, PLAN_DT_F32, 0); }

/* The optimizer is f32 (optim.c): n_f32 tensors, lr and coef f32 scalars at `scalars`,
 * then the i32 step; but the gradient, input 1, may be 16-bit (read as it is), and so
 * may sgd's momentum buffer without momentum, which is the gradient itself. */
static int optimizer(OpCheck *c, int n_f32, int scalars)
{
    for (int i = 0; i < n_f32; i++) {
        int grad = i == 1 || (i == 2 && in_id(c, i) == in_id(c, 1));
        if (grad ? want_float(c, i) : want_dtype(c, i, PLAN_DT_F32, i >= scalars ? 0 : -1)) return -1;
    }
    return want_dtype(c, n_f32, PLAN_DT_I32, 0);
}

static int extra_adamw(OpCheck *c) { return optimizer(c, 6, 4); }
static int extra_sgd(OpCheck *c) { return optimizer(c, 5, 3); }
/* (w, after the step: the shape rule checks it is a 16-bit copy of p) */
static int extra_adamw_cast(OpCheck *c) { return optimizer(c, 6, 4); }
static int extra_sgd_cast(OpCheck *c) { return optimizer(c, 5, 3); }

/* A collective runs across its group: the program's data-parallel ranks (group 0), the
 * stages (group 1), or with hybrid sharding the shard group (2: S of them, the plan's
 * shard_group) or the replica group (3: D / S); the executor refuses any other. Checked
 * before the shape rule, which multiplies by the world. */
static int check_collective(OpCheck *c)
{
    int64_t w = attr_int(c, "world", 0), g = attr_int(c, "group", OP_GROUP_DATA), n;
    int64_t s = plan_shard_group(c->p, c->world), over = attr_int(c, "avg_over", 0);
    if (g < OP_GROUP_DATA || g > OP_GROUP_REPLICA)
        return fail(c, "group %" PRId64 ": a collective runs over group 0 (the data-parallel ranks), 1 (the stages), 2 "
                    "(the shard group) or 3 (the replica group)", g);
    if ((g == OP_GROUP_SHARD && w != s) || (g == OP_GROUP_REPLICA && w * s != c->world))
        return fail(c, "a collective over the %s group for %" PRId64 " ranks, but the plan's shard_group is %" PRId64
                    " of %" PRId64 " data-parallel ranks", g == OP_GROUP_SHARD ? "shard" : "replica", w, s, c->world);
    if (over < 0 || over > c->world)
        return fail(c, "avg_over %" PRId64 ": an average is over at most the %" PRId64 " data-parallel ranks", over,
                    c->world);
    if (g == OP_GROUP_DATA && w != c->world)
        return fail(c, "a collective for a world of %" PRId64 " ranks, but the plan is for a world of %" PRId64, w, c->world);
    if (g == OP_GROUP_PIPE && (w < 1 || w > RT_MAX_WORLD || (c->stages && w != c->stages)))
        return fail(c, "a collective over the pipeline group for %" PRId64 " stages, but the plan has %" PRId64, w,
                    c->stages);
    if (__builtin_mul_overflow(plan_tensor_numel(in_t(c, 0)), w, &n)) return fail(c, "input 0 is too large to gather");
    return 0;
}

/* Ops whose kernels ask more than their shape rules check. */
static int (*const extra[OP_COUNT])(OpCheck *) = {
    [OP_relu_bwd] = extra_float2,        [OP_gelu_bwd] = extra_float2,       [OP_silu_bwd] = extra_float2,
    [OP_tanh_bwd] = extra_float2,        [OP_sigmoid_bwd] = extra_float2,    [OP_sqrt_bwd] = extra_float2,
    [OP_rsqrt_bwd] = extra_float2,       [OP_sum_to] = extra_float1,         [OP_sumsq_parts] = extra_float1,
    [OP_max_bwd] = extra_max_bwd,        [OP_softmax_bwd] = extra_softmax_bwd,
    [OP_layernorm_bwd] = extra_layernorm_bwd, [OP_rmsnorm_bwd] = extra_rmsnorm_bwd,
    [OP_embedding_bwd] = extra_embedding_bwd, [OP_cross_entropy_bwd] = extra_cross_entropy_bwd,
    [OP_attention_bwd] = extra_attention_bwd, [OP_lr_at] = extra_lr_at,   [OP_clip_coef] = extra_clip_coef,
    [OP_count_step] = extra_count_step,  [OP_scale_update] = extra_scale_update,
    [OP_adamw] = extra_adamw,            [OP_sgd] = extra_sgd,
    [OP_adamw_cast] = extra_adamw_cast,  [OP_sgd_cast] = extra_sgd_cast,
    [OP_attention_qkv_bwd] = extra_attention_qkv_bwd,
    [OP_attention_qkv_masked_bwd] = extra_attention_qkv_masked_bwd,
    [OP_layernorm_bwd_add] = extra_layernorm_bwd, [OP_rmsnorm_bwd_add] = extra_rmsnorm_bwd,
    [OP_attention_rows_bwd] = extra_attention_rows_bwd,
};

/* ---- one op ------------------------------------------------------------------------------ */

static int check_op(OpCheck *c)
{
    const Plan *p = c->p;
    c->op = &p->ops[c->k];
    c->name = plan_str(p, c->op->op);
    c->kind = op_lookup(c->name);
    if (c->kind == OP_COUNT || !cpu_kernel_by_name(c->name))
        return fail(c, "plan uses op '%s' that this fsexec does not know; rebuild fsexec", c->name);
    c->info = op_info(c->kind);
    c->attrs = (OpAttrs){c, find_attr};
    if (check_arity(c) || check_dims(c) || check_attrs(c)) return -1;
    /* Inputs are made before they are read: a kernel never sees a buffer of last step. */
    for (int i = 0; i < c->op->n_in; i++) {
        int32_t pr = in_t(c, i)->producer;
        if (pr != PLAN_NONE && pr >= c->k) {
            char what[256];
            return fail(c, "input %d, %s, is made by op %d, not before this op", i,
                        describe(c, in_id(c, i), what, sizeof what), pr);
        }
    }
    for (int i = 0; i < c->op->n_in; i++) c->in[i] = type_of(in_t(c, i));
    /* Inputs first (the rule, then what the kernel asks beyond it), then the outputs: a
     * bad input is named as such, not as the wrong output it leads to. */
    ShapeCtx sc;
    if ((c->info->flags & OPF_COLLECTIVE) && check_collective(c)) return -1;
    if (run_rule(c, c->kind, c->in, c->op->n_in, &sc) || (extra[c->kind] && extra[c->kind](c))) return -1;
    return check_outputs(c, &sc);
}

/* Each stage of a plan of several as its ranks run it: alone, its data the whole's. */
static int check_stages(const Plan *p, char *err, size_t errlen)
{
    char why[768];
    for (int32_t k = 0; k < p->n_programs; k++) {
        Plan *one = plan_extract_program(p, k, why, sizeof why);
        int rc = !one || rt_plan_check_stage(one, p, why, sizeof why);
        plan_free(one);
        if (rc) return plan_fail(err, errlen, "stage %d: %s", k, why);
    }
    return 0;
}

int rt_plan_check_stage(const Plan *p, const Plan *whole, char *err, size_t errlen)
{
    if (plan_check(p, err, errlen)) return -1;
    if (p->n_programs > 1) return check_stages(p, err, errlen);
    if (rt_plan_check_layout(p, err, errlen)) return -1;
    OpCheck c = {.p = p, .world = p->programs[0].dp_world, .stages = whole ? whole->n_programs : 0, .err = err,
                 .errlen = errlen};
    for (c.k = 0; c.k < p->n_ops; c.k++)
        if (check_op(&c)) return -1;
    return rt_plan_check_values(p, whole, err, errlen);
}

int rt_plan_check_ops(const Plan *p, char *err, size_t errlen) { return rt_plan_check_stage(p, NULL, err, errlen); }
