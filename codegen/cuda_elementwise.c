/* codegen/cuda_elementwise.c: the CUDA emitters of the elementwise ops (OPF_ELEMWISE:
 * add sub mul div neg exp log sqrt rsqrt tanh sigmoid relu gelu silu cast pow and the
 * unary ops' backward), alone or as a fused group (passes/fuse.c).
 *
 * Both are one kernel of the same form: a grid-stride loop over the elements of the
 * output shape; per element, the inputs from outside the chain are loaded (broadcast like
 * numpy: each operand's offset is compiled from its strides, 0 along broadcast dims), then
 * each member computes its value from named operands u (and v), then the outputs are
 * stored. A lone node is a chain of one. In a group, every member's value is rounded to
 * its dtype as the CPU backend rounds its output (fs_rn_*), so the chain computes what
 * running the members one by one computes; only the member outputs whose bytes live past
 * the group (Value.live_end, after memplan) are written, the rest stay in registers.
 *
 * Floats are computed in f32 with the CPU kernels' formulas (runtime/cpu/elementwise.c);
 * i32 add, sub, mul and neg wrap, through unsigned arithmetic, as the CPU's do.
 */
#include <string.h>

#include "cuda.h"

/* Each op's value from its operands u (input 0) and v (input 1), in f32 and, for the
 * ops that take them, in i32. */
static const struct {
    OpKind op;
    const char *f32, *i32;
} EXPRS[] = {
    {OP_add, "u + v", "(int)((unsigned)u + (unsigned)v)"},
    {OP_sub, "u - v", "(int)((unsigned)u - (unsigned)v)"},
    {OP_mul, "u * v", "(int)((unsigned)u * (unsigned)v)"},
    {OP_div, "u / v", NULL},
    {OP_neg, "-u", "(int)(0u - (unsigned)u)"},
    {OP_exp, "expf(u)", NULL},
    {OP_log, "logf(u)", NULL},
    {OP_sqrt, "sqrtf(u)", NULL},
    {OP_rsqrt, "1.0f / sqrtf(u)", NULL},
    {OP_tanh, "tanhf(u)", NULL},
    {OP_sigmoid, "fs_sigmoid(u)", NULL},
    {OP_relu, "u < 0.0f ? 0.0f : u", NULL},
    {OP_gelu, "fs_gelu(u)", NULL},
    {OP_silu, "u * fs_sigmoid(u)", NULL},
    {OP_cast, "u", NULL},  // the output's dtype does the rounding
    /* backward: u is x (or the forward's y), v is dy */
    {OP_relu_bwd, "u > 0.0f ? v : 0.0f", NULL},
    {OP_gelu_bwd, "v * fs_gelu_grad(u)", NULL},
    {OP_silu_bwd, "v * fs_silu_grad(u)", NULL},
    {OP_tanh_bwd, "v * (1.0f - u * u)", NULL},
    {OP_sigmoid_bwd, "v * u * (1.0f - u)", NULL},
    {OP_sqrt_bwd, "v * 0.5f / u", NULL},
    {OP_rsqrt_bwd, "-0.5f * v * u * u * u", NULL},
};

/* The f32 values of ops that depend on an attribute, looked up before EXPRS: a flag's row
 * is the op's when the flag is set (gelu's exact form); a float's value fills the row's %s
 * (pow's exponent, a constant of the kernel). */
static const struct {
    OpKind op;
    const char *f32, *attr;
} ATTR_EXPRS[] = {
    {OP_gelu, "fs_gelu_erf(u)", "exact"},
    {OP_gelu_bwd, "v * fs_gelu_erf_grad(u)", "exact"},
    {OP_pow, "fs_pow(u, %s)", "p"},
    {OP_pow_bwd, "v * fs_pow_grad(u, %s)", "p"},
};

static const char *expr_of(CuCtx *c, const Node *n, DType dt)
{
    const OpInfo *info = op_info(n->op);
    for (size_t i = 0; i < sizeof ATTR_EXPRS / sizeof *ATTR_EXPRS && dt != DT_I32; i++) {
        const char *a = ATTR_EXPRS[i].attr;
        if (ATTR_EXPRS[i].op != n->op) continue;
        if (info->params[op_param_index(info, a)].kind != ARG_FLAG)
            return cu_fmt(c, ATTR_EXPRS[i].f32, cu_float(c, (float)ir_attr_float(c->g, n, a, 0)));
        if (ir_attr_int(c->g, n, a, 0)) return ATTR_EXPRS[i].f32;
    }
    for (size_t i = 0; i < sizeof EXPRS / sizeof *EXPRS; i++)
        if (EXPRS[i].op == n->op) return dt == DT_I32 ? EXPRS[i].i32 : EXPRS[i].f32;
    return NULL;
}

enum { MAX_TERMS = OPS_FUSE_MAX };  // distinct inputs from outside a chain, and member outputs

/* The chain [first, last]: its outside inputs (in first-use order) and what it writes. */
typedef struct {
    int first, last;
    int in[MAX_TERMS], n_in;    // value ids read from outside the chain
    int out[MAX_TERMS], n_out;  // member outputs written (value ids)
} Chain;

static int find(const int *ids, int n, int v)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == v) return i;
    return -1;
}

static int inside(const Graph *g, const Chain *ch, int v)
{
    int p = ir_value(g, v)->producer;
    return p >= ch->first && p <= ch->last;
}

/* A member's output is written when anything after the chain may read its bytes: the
 * chain's own result always, others when memplan keeps them alive past the chain, or
 * when they are not plain activations (a gradient, a buffer another value lies in). */
static int written(const Graph *g, const Chain *ch, int v)
{
    const Value *val = ir_value(g, v);
    return val->producer == ch->last || val->live_end > ch->last || val->role != ROLE_ACT || val->alias >= 0;
}

static int collect(CuCtx *c, Chain *ch)
{
    const Graph *g = c->g;
    for (int n = ch->first; n <= ch->last; n++) {
        const Node *node = ir_node(g, n);
        for (int i = 0; i < node->n_in; i++) {
            int v = ir_in(g, node, i);
            if (inside(g, ch, v) || find(ch->in, ch->n_in, v) >= 0) continue;
            if (ch->n_in == MAX_TERMS) return cu_fail(c, "more than %d inputs in one kernel", MAX_TERMS);
            ch->in[ch->n_in++] = v;
        }
        int o = ir_out(g, node, 0);
        if (written(g, ch, o)) ch->out[ch->n_out++] = o;  // at most one per member, members <= MAX_TERMS
    }
    return 0;
}

/* The kernel's name: its ops joined ("add_gelu"), or "fused" for a long chain. */
static const char *chain_prefix(CuCtx *c, const Chain *ch)
{
    CuText t = cu_text(c);
    for (int n = ch->first; n <= ch->last; n++)
        cu_text_add(&t, "%s%s", n > ch->first ? "_" : "", op_name(ir_node(c->g, n)->op));
    return t.len <= 32 ? t.s : "fused";
}

/* The operand name of value v: xK for the K-th outside input, tK for member K's value. */
static char *operand(CuCtx *c, const Chain *ch, int v)
{
    int k = find(ch->in, ch->n_in, v);
    return k >= 0 ? cu_fmt(c, "x%d", k) : cu_fmt(c, "t%d", ir_value(c->g, v)->producer - ch->first);
}

/* One block per member: `float tK; { const float u = .., v = ..; tK = fs_rn_bf16(expr); }`. */
static int member_line(CuCtx *c, const Chain *ch, int n, CuText *body)
{
    const Node *node = ir_node(c->g, n);
    const Value *out = ir_value(c->g, ir_out(c->g, node, 0));
    DType dt = node->op == OP_cast ? ir_value(c->g, ir_in(c->g, node, 0))->dtype : out->dtype;
    const char *e = expr_of(c, node, dt);
    if (!e) return cu_fail(c, "no CUDA expression for %s on %s", op_name(node->op), dtype_name(dt));
    const char *type = dt == DT_I32 ? "int" : "float", *rn = cu_rn(out->dtype);
    cu_text_add(body, "        %s t%d;\n        {\n            const %s u = %s", type, n - ch->first, type,
                operand(c, ch, ir_in(c->g, node, 0)));
    if (node->n_in > 1) cu_text_add(body, ", v = %s", operand(c, ch, ir_in(c->g, node, 1)));
    cu_text_add(body, ";\n            t%d = %s(%s);\n        }\n", n - ch->first, rn, e);
    return 0;
}

/* The chain's kernel and its launch: parameters are the outside inputs, then the
 * written outputs. */
static int emit_chain(CuCtx *c, int first, int last)
{
    const Graph *g = c->g;
    Chain ch = {.first = first, .last = last};
    if (last - first + 1 > MAX_TERMS) return cu_fail(c, "a fused group of %d nodes (at most %d)", last - first + 1, MAX_TERMS);
    if (collect(c, &ch)) return -1;
    const Value *shape = ir_value(g, ir_out(g, ir_node(g, last), 0));
    int64_t n = ir_numel(shape);
    if (n == 0) return 0;
    const char *idx = cu_index(n);

    CuText src = cu_text(c), body = cu_text(c);
    int args[2 * MAX_TERMS], n_args = 0;
    cu_text_add(&src, "extern \"C\" __global__ void KNAME(");
    for (int k = 0; k < ch.n_in; k++) {
        const Value *x = ir_value(g, ch.in[k]);
        if (x->rank > shape->rank) return cu_fail(c, "input of rank %d does not broadcast to rank %d", x->rank, shape->rank);
        cu_text_add(&src, "%sconst %s *in%d", n_args ? ", " : "", cu_type(x->dtype), k);
        args[n_args++] = ch.in[k];
        const char *at = cu_bcast_index(c, shape, x, "i");
        if (x->dtype == DT_I32) cu_text_add(&body, "        const int x%d = in%d[%s];\n", k, k, at);
        else cu_text_add(&body, "        const float x%d = ld(in%d, %s);\n", k, k, at);
    }
    for (int m = first; m <= last; m++)
        if (member_line(c, &ch, m, &body)) return -1;
    for (int k = 0; k < ch.n_out; k++) {
        const Value *o = ir_value(g, ch.out[k]);
        int t = o->producer - first;
        cu_text_add(&src, "%s%s *out%d", n_args ? ", " : "", cu_type(o->dtype), k);
        args[n_args++] = ch.out[k];
        if (o->dtype == DT_I32) cu_text_add(&body, "        out%d[i] = t%d;\n", k, t);
        else cu_text_add(&body, "        st(out%d, i, t%d);\n", k, t);
    }
    cu_text_add(&src, ")\n{\n    %s {\n%s    }\n}\n", cu_loop(c, idx, n), body.s);
    return cu_launch(c, chain_prefix(c, &ch), src.s, cu_grid(n), (CuDim){CU_BLOCK, 1, 1}, 0, args, n_args);
}

int cu_group(CuCtx *c, int first) { return emit_chain(c, first, c->node); }

#define ELEMWISE(name) \
    int cuda_##name(CuCtx *c) { return emit_chain(c, c->node, c->node); }
ELEMWISE(add)
ELEMWISE(sub)
ELEMWISE(mul)
ELEMWISE(div)
ELEMWISE(neg)
ELEMWISE(exp)
ELEMWISE(log)
ELEMWISE(sqrt)
ELEMWISE(rsqrt)
ELEMWISE(tanh)
ELEMWISE(sigmoid)
ELEMWISE(relu)
ELEMWISE(gelu)
ELEMWISE(silu)
ELEMWISE(cast)
ELEMWISE(relu_bwd)
ELEMWISE(gelu_bwd)
ELEMWISE(silu_bwd)
ELEMWISE(tanh_bwd)
ELEMWISE(sigmoid_bwd)
ELEMWISE(sqrt_bwd)
ELEMWISE(rsqrt_bwd)
ELEMWISE(pow)
ELEMWISE(pow_bwd)
