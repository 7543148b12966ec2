/* ir/flops.c: forward FLOPs of every op (flops_NAME, one per ops.def row).
 *
 * Conventions, so that numbers can be checked by hand:
 *  - a multiply-add is 2 FLOPs: matmul is 2*M*N*K per batch item;
 *  - every scalar add, multiply, compare, divide or transcendental function (exp, log,
 *    sqrt, tanh) counts 1; the per-element constants below follow from each op's formula;
 *  - attention counts its two matmuls only, in full: 2*T*S*D + 2*T*S*Dv per batch item
 *    (4*T*S*D when Dv == D). A causal mask does not halve it and the softmax is not
 *    added, the convention of the usual MFU arithmetic. The batch items are q's: under
 *    grouped-query attention each of the NH query heads does its own products against
 *    its shared kv head, so NKV < NH saves memory and traffic, not FLOPs;
 *  - moving elements (views, layout ops, gathers, constants) costs 0.
 * Backward FLOPs are the backward nodes' own forward counts; nothing here is doubled.
 * What a node computes again of the forward (a recompute node, attention's backward
 * redoing Q K^T) is ir_node_redone_flops: reports count it as recompute, so that MFU
 * from fsc's figures counts model FLOPs (forward + backward, each once).
 *
 * Where it sits: the cost model (pipeline balancing) and reports sum these per node.
 */
#include "ir.h"

/* Scalar operations per element of each formula. */
enum {
    SIGMOID_FLOPS = 4,    // 1 / (1 + exp(-x)): neg, exp, add, div
    SILU_FLOPS = 5,       // x * sigmoid(x)
    GELU_FLOPS = 9,       // 0.5 x (1 + tanh(k (x + 0.044715 x^3))): 3 mul for x^3 and its
                          // factor, add, mul by k, tanh, add 1, two muls
    MEAN_FLOPS = 1,       // add; the divide is per output element
    SOFTMAX_FLOPS = 5,    // max, sub, exp, sum, div
    LAYERNORM_FLOPS = 7,  // sum, sub, square, sum, mul by rstd, mul w, add b
    RMSNORM_FLOPS = 4,    // square, sum, mul by rstd, mul w
    XENT_FLOPS = 4,       // max, sub, exp, sum (the log and pick are per row)
    ROPE_FLOPS = 3,       // x * cos + rotate_half(x) * sin, tables precomputed
    GELU_BWD_FLOPS = 14,  // the tanh, its square, the polynomial and its derivative
    SILU_BWD_FLOPS = 8,   // sigmoid, then dy * s * (1 + x (1 - s))
    LAYERNORM_BWD_FLOPS = 12,  // the stats again, two row sums, dx, dw and db
    RMSNORM_BWD_FLOPS = 8,
    ADAMW_FLOPS = 14,     // decay, two moments, two bias corrections, sqrt, div, update
    SGD_FLOPS = 5,        // decay, momentum, update
};

static double in_numel(const Graph *g, const Node *n, int i) { return (double)ir_numel(ir_value(g, ir_in(g, n, i))); }
static double out_numel(const Graph *g, const Node *n) { return (double)ir_numel(ir_value(g, ir_out(g, n, 0))); }

/* 2 * (output elements) * K, K the contracted dim: this is 2*M*N*K*batch for every form
 * of torch.matmul, 1-D operands included. */
double flops_matmul(const Graph *g, const Node *n)
{
    const Value *a = ir_value(g, ir_in(g, n, 0));
    int ta = ir_attr_int(g, n, "ta", 0) != 0;
    return 2.0 * out_numel(g, n) * (double)a->shape[a->rank - 1 - ta];
}

double flops_add(const Graph *g, const Node *n) { return out_numel(g, n); }
double flops_sub(const Graph *g, const Node *n) { return out_numel(g, n); }
double flops_mul(const Graph *g, const Node *n) { return out_numel(g, n); }
double flops_div(const Graph *g, const Node *n) { return out_numel(g, n); }
double flops_neg(const Graph *g, const Node *n) { return out_numel(g, n); }
double flops_exp(const Graph *g, const Node *n) { return out_numel(g, n); }
double flops_log(const Graph *g, const Node *n) { return out_numel(g, n); }
double flops_sqrt(const Graph *g, const Node *n) { return out_numel(g, n); }
double flops_rsqrt(const Graph *g, const Node *n) { return out_numel(g, n); }
double flops_tanh(const Graph *g, const Node *n) { return out_numel(g, n); }
double flops_sigmoid(const Graph *g, const Node *n) { return SIGMOID_FLOPS * out_numel(g, n); }
double flops_relu(const Graph *g, const Node *n) { return out_numel(g, n); }
double flops_gelu(const Graph *g, const Node *n) { return GELU_FLOPS * out_numel(g, n); }
double flops_silu(const Graph *g, const Node *n) { return SILU_FLOPS * out_numel(g, n); }

double flops_sum(const Graph *g, const Node *n) { return in_numel(g, n, 0); }
double flops_mean(const Graph *g, const Node *n) { return MEAN_FLOPS * in_numel(g, n, 0) + out_numel(g, n); }
double flops_max(const Graph *g, const Node *n) { return in_numel(g, n, 0); }
double flops_softmax(const Graph *g, const Node *n) { return SOFTMAX_FLOPS * in_numel(g, n, 0); }
double flops_layernorm(const Graph *g, const Node *n) { return LAYERNORM_FLOPS * in_numel(g, n, 0); }
double flops_rmsnorm(const Graph *g, const Node *n) { return RMSNORM_FLOPS * in_numel(g, n, 0); }
double flops_embedding(const Graph *g, const Node *n) { return 0; }
double flops_cross_entropy(const Graph *g, const Node *n) { return XENT_FLOPS * in_numel(g, n, 0); }

double flops_reshape(const Graph *g, const Node *n) { return 0; }
double flops_transpose(const Graph *g, const Node *n) { return 0; }
double flops_permute(const Graph *g, const Node *n) { return 0; }
double flops_split(const Graph *g, const Node *n) { return 0; }
double flops_concat(const Graph *g, const Node *n) { return 0; }
double flops_heads(const Graph *g, const Node *n) { return 0; }
double flops_merge_heads(const Graph *g, const Node *n) { return 0; }

double flops_rope(const Graph *g, const Node *n) { return ROPE_FLOPS * in_numel(g, n, 0); }

/* batch * T * S of attention's score matrix (q's batch dims: every query head, however
 * few kv heads it shares), and its head dims D (q, k) and Dv (v). */
static double attention_dims(const Graph *g, const Node *n, double *D, double *Dv)
{
    const Value *q = ir_value(g, ir_in(g, n, 0)), *k = ir_value(g, ir_in(g, n, 1)), *v = ir_value(g, ir_in(g, n, 2));
    int r = q->rank;
    double scores = (double)q->shape[r - 2] * (double)k->shape[r - 2];
    for (int d = 0; d < r - 2; d++) scores *= (double)q->shape[d];
    *D = (double)q->shape[r - 1], *Dv = (double)v->shape[r - 1];
    return scores;
}

/* q (..., T, D), k (..., S, D), v (..., S, Dv): QK^T then PV, both in full. */
double flops_attention(const Graph *g, const Node *n)
{
    double D, Dv, scores = attention_dims(g, n, &D, &Dv);
    return 2.0 * scores * (D + Dv);
}

/* attention_qkv (qkv [..., T, (nh + 2 nkv) D]): attention's two products over its nh query heads;
 * *D the head dim (D = Dv). */
static double packed_dims(const Graph *g, const Node *n, double *D)
{
    const Value *x = ir_value(g, ir_in(g, n, 0));
    int r = x->rank;
    int64_t nh = ir_attr_int(g, n, "nh", 1), nkv = ir_attr_int(g, n, "nkv", 1);
    double scores = (double)nh * (double)x->shape[r - 2] * (double)x->shape[r - 2];
    for (int d = 0; d < r - 2; d++) scores *= (double)x->shape[d];
    int rows = n->op == OP_attention_rows || n->op == OP_attention_rows_bwd;  // input 0 is q [..., T, nh D]
    *D = (double)(x->shape[r - 1] / (rows ? nh : nh + 2 * nkv));
    return scores;
}

double flops_attention_qkv(const Graph *g, const Node *n)
{
    double D, scores = packed_dims(g, n, &D);
    return 4.0 * scores * D;
}

double flops_rope_at(const Graph *g, const Node *n) { return ROPE_FLOPS * in_numel(g, n, 0); }

/* q (..., T, D) against the whole cache (..., S, D), (..., S, Dv): what the last position
 * does; earlier ones see fewer rows. */
double flops_attention_decode(const Graph *g, const Node *n)
{
    const Value *q = ir_value(g, ir_in(g, n, 0)), *kc = ir_value(g, ir_in(g, n, 3)), *vc = ir_value(g, ir_in(g, n, 4));
    int r = q->rank;
    double scores = (double)ir_numel(q) / (double)q->shape[r - 1] * (double)kc->shape[r - 2];
    return 2.0 * scores * (double)(q->shape[r - 1] + vc->shape[r - 1]);
}

double flops_arange(const Graph *g, const Node *n) { return 0; }
/* The mask's compare and the scale; the Philox rounds are integer work, not FLOPs. */
double flops_dropout(const Graph *g, const Node *n) { return out_numel(g, n); }
double flops_scalar(const Graph *g, const Node *n) { return 0; }

/* ---- compiler-made ops: constants, backward, optimizer ------------------------------ */

double flops_full(const Graph *g, const Node *n) { return 0; }
double flops_buffer(const Graph *g, const Node *n) { return 0; }
double flops_cast(const Graph *g, const Node *n) { return out_numel(g, n); }
double flops_sum_to(const Graph *g, const Node *n) { return in_numel(g, n, 0); }
double flops_expand(const Graph *g, const Node *n) { return 0; }
double flops_relu_bwd(const Graph *g, const Node *n) { return out_numel(g, n); }
double flops_gelu_bwd(const Graph *g, const Node *n) { return GELU_BWD_FLOPS * out_numel(g, n); }
double flops_silu_bwd(const Graph *g, const Node *n) { return SILU_BWD_FLOPS * out_numel(g, n); }
double flops_tanh_bwd(const Graph *g, const Node *n) { return 3 * out_numel(g, n); }
double flops_sigmoid_bwd(const Graph *g, const Node *n) { return 3 * out_numel(g, n); }
double flops_sqrt_bwd(const Graph *g, const Node *n) { return 2 * out_numel(g, n); }
double flops_rsqrt_bwd(const Graph *g, const Node *n) { return 4 * out_numel(g, n); }
double flops_max_bwd(const Graph *g, const Node *n) { return out_numel(g, n); }
double flops_softmax_bwd(const Graph *g, const Node *n) { return 4 * out_numel(g, n); }
double flops_layernorm_bwd(const Graph *g, const Node *n) { return LAYERNORM_BWD_FLOPS * in_numel(g, n, 0); }
double flops_rmsnorm_bwd(const Graph *g, const Node *n) { return RMSNORM_BWD_FLOPS * in_numel(g, n, 0); }
/* The norm's backward and the residual gradient's add it took over. */
double flops_layernorm_bwd_add(const Graph *g, const Node *n) { return (LAYERNORM_BWD_FLOPS + 1) * in_numel(g, n, 0); }
double flops_rmsnorm_bwd_add(const Graph *g, const Node *n) { return (RMSNORM_BWD_FLOPS + 1) * in_numel(g, n, 0); }
double flops_embedding_bwd(const Graph *g, const Node *n) { return in_numel(g, n, 1); }
double flops_embedding_bwd_into(const Graph *g, const Node *n) { return in_numel(g, n, 2); }
double flops_cross_entropy_bwd(const Graph *g, const Node *n) { return XENT_FLOPS * out_numel(g, n); }
/* The loss's pass and the gradient's, as the two ops count them. */
double flops_cross_entropy_fused(const Graph *g, const Node *n) { return 2 * XENT_FLOPS * in_numel(g, n, 0); }
double flops_slice(const Graph *g, const Node *n) { return 0; }
double flops_slice_bwd(const Graph *g, const Node *n) { return 0; }
double flops_slice_view(const Graph *g, const Node *n) { return 0; }

/* Backward redoes Q K^T, then dP = dO V^T, dV = P^T dO, dQ = dS K and dK = dS^T Q:
 * five products where the forward had two. The first redoes the forward's work
 * (ir_node_redone_flops), the other four are the backward's own. */
double flops_attention_bwd(const Graph *g, const Node *n)
{
    double D, Dv, scores = attention_dims(g, n, &D, &Dv);
    return 2.0 * scores * (3 * D + 2 * Dv);
}

/* The mask costs one compare per score: attention's count. */
double flops_attention_masked(const Graph *g, const Node *n) { return flops_attention(g, n); }
double flops_attention_masked_bwd(const Graph *g, const Node *n) { return flops_attention_bwd(g, n); }

double flops_attention_qkv_bwd(const Graph *g, const Node *n)
{
    double D, scores = packed_dims(g, n, &D);
    return 10.0 * scores * D;
}

/* The mask costs one compare per score: attention_qkv's count. */
double flops_attention_qkv_masked(const Graph *g, const Node *n) { return flops_attention_qkv(g, n); }
double flops_attention_qkv_masked_bwd(const Graph *g, const Node *n) { return flops_attention_qkv_bwd(g, n); }

double ir_node_redone_flops(const Graph *g, const Node *n)
{
    if (n->phase == PHASE_RECOMPUTE) return ir_op_hooks(n->op)->flops(g, n);
    if (n->op == OP_attention_qkv_bwd || n->op == OP_attention_qkv_masked_bwd || n->op == OP_attention_rows_bwd) {
        double D, scores = packed_dims(g, n, &D);
        return 2.0 * scores * D;
    }
    if (n->op != OP_attention_bwd && n->op != OP_attention_masked_bwd) return 0;
    double D, Dv, scores = attention_dims(g, n, &D, &Dv);
    (void)Dv;
    return 2.0 * scores * D;  // Q K^T again: the scores the forward did not keep
}

double flops_sumsq_parts(const Graph *g, const Node *n) { return 2 * in_numel(g, n, 0); }
double flops_sum_parts(const Graph *g, const Node *n)
{
    double f = 0;
    for (int i = 0; i < n->n_in; i++) f += in_numel(g, n, i);
    return f;
}
double flops_lr_at(const Graph *g, const Node *n) { return 0; }
double flops_clip_coef(const Graph *g, const Node *n) { return 0; }
double flops_count_step(const Graph *g, const Node *n) { return 0; }
double flops_target_count(const Graph *g, const Node *n) { return in_numel(g, n, 0); }
double flops_scale_update(const Graph *g, const Node *n) { return 0; }
double flops_adamw(const Graph *g, const Node *n) { return ADAMW_FLOPS * in_numel(g, n, 0); }
double flops_sgd(const Graph *g, const Node *n) { return SGD_FLOPS * in_numel(g, n, 0); }
double flops_adamw_cast(const Graph *g, const Node *n) { return (ADAMW_FLOPS + 1) * in_numel(g, n, 0); }
double flops_sgd_cast(const Graph *g, const Node *n) { return (SGD_FLOPS + 1) * in_numel(g, n, 0); }

/* Communication moves bytes; the reductions' additions are the network's, not ours. */
double flops_copy(const Graph *g, const Node *n) { return 0; }
double flops_to_host(const Graph *g, const Node *n) { return 0; }
double flops_to_device(const Graph *g, const Node *n) { return 0; }
double flops_all_reduce(const Graph *g, const Node *n) { return 0; }
double flops_reduce_scatter(const Graph *g, const Node *n) { return 0; }
double flops_all_gather(const Graph *g, const Node *n) { return 0; }
double flops_send(const Graph *g, const Node *n) { return 0; }
double flops_recv(const Graph *g, const Node *n) { return 0; }

/* x ** p: a powf, counted as two ops; its backward a powf and two multiplies. */
double flops_pow(const Graph *g, const Node *n) { return 2 * out_numel(g, n); }
double flops_pow_bwd(const Graph *g, const Node *n) { return 4 * out_numel(g, n); }

/* The GEMM epilogues: the product's FLOPs and the work each epilogue took over (the bias add, the GELU and its
 * gradient, the bias gradient's sum), as the ops it replaced count them. */
static double product_flops(const Graph *g, const Node *n)
{
    const Value *b = ir_value(g, ir_in(g, n, 1));
    return 2.0 * out_numel(g, n) * (double)b->shape[ir_attr_int(g, n, "tb", 0) ? 1 : 0];
}
double flops_matmul_bias(const Graph *g, const Node *n) { return product_flops(g, n) + out_numel(g, n); }
double flops_matmul_bias_add(const Graph *g, const Node *n) { return product_flops(g, n) + 2 * out_numel(g, n); }
double flops_matmul_add(const Graph *g, const Node *n) { return product_flops(g, n) + out_numel(g, n); }
double flops_matmul_bias_gelu(const Graph *g, const Node *n)
{
    return product_flops(g, n) + (1 + GELU_FLOPS) * out_numel(g, n);
}
double flops_matmul_dgelu_bgrad(const Graph *g, const Node *n)
{
    return product_flops(g, n) + (1 + GELU_BWD_FLOPS) * out_numel(g, n);
}
double flops_matmul_bgrad(const Graph *g, const Node *n)
{
    int side = (int)ir_attr_int(g, n, "side", 1);
    return product_flops(g, n) + in_numel(g, n, side);
}

/* attention_rows (q [..., T, nh D]) and its backward: attention_qkv's counts. */
double flops_attention_rows(const Graph *g, const Node *n) { return flops_attention_qkv(g, n); }
double flops_attention_rows_bwd(const Graph *g, const Node *n) { return flops_attention_qkv_bwd(g, n); }
double flops_rope_rows(const Graph *g, const Node *n) { return ROPE_FLOPS * in_numel(g, n, 0); }
double flops_pad(const Graph *g, const Node *n) { return 0; }
