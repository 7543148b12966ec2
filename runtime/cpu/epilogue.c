/* runtime/cpu/epilogue.c: the GEMM epilogue ops (passes/epilogue.c): the product by
 * cpu_matmul into the op's own output, then the epilogue in one pass over it, row by row,
 * then (bias gradients) cpu_sum_to. Each computes what the ops it replaced compute, in the
 * same order and with the same roundings: the product rounded to its dtype, the bias add
 * rounded, the GELU of the rounded sum, the gradient sum over the rounded GELU gradient
 * (or over dy) in sum_to's fixed order. So a plan with the rewrite trains bit for bit as
 * one without it on this backend (but for the residual's association, x + (a w + bias)).
 * cuBLASLt applies its epilogue to the f32 accumulator and rounds once, so CUDA agrees to
 * the 16-bit rounding; in f32 the two agree to rounding.
 *
 * Attributes by position: matmul_bias, matmul_bias_gelu, matmul_dgelu_bgrad (a, b, x, ta,
 * tb): ta attr[3], tb attr[4]; matmul_bgrad (a, b, ta, tb, side): ta attr[2], tb attr[3],
 * side attr[4]. The workspace is the product's (cpu_work_matmul).
 */
#include "cpu_impl.h"

#define COLS_AT_ONCE 256  // columns of a row staged as f32 on the stack

/* The matmul call of op call k: its two operands, output `out` of k, k's ta and tb. */
static KCall product(const KCall *k, int out)
{
    int at = k->n_in == 3 ? 3 : 2;
    KCall m = *k;
    m.n_in = 2, m.n_out = 1, m.out[0] = k->out[out];
    m.attr[2] = k->attr[at], m.attr[3] = k->attr[at + 1];
    return m;
}

CpuWork cpu_work_epilogue(const KCall *k)
{
    KCall m = product(k, 0);
    return cpu_work_matmul(&m);
}

/* db = x [..., N] summed over its rows, as sum_to sums them. */
static void row_sums(const KTensor *x, const KTensor *db)
{
    KCall s = {.n_in = 1, .n_out = 1};
    s.in[0] = *x, s.out[0] = *db;
    cpu_sum_to(&s);
}

typedef enum { EPI_BIAS, EPI_BIAS_GELU, EPI_DGELU } Epi;

/* The epilogue over c [rows, N] (the product, in c's dtype), v a bias [N] or the GELU's
 * input [rows, N]: EPI_BIAS: c += v; EPI_BIAS_GELU: c += v, y = gelu(c); EPI_DGELU: c *=
 * gelu'(v). Each stored value rounded to its dtype as the separate ops round it. */
static void epilogue(Epi e, const KTensor *c, const KTensor *v, const KTensor *y)
{
    int64_t N = c->shape[c->rank - 1], rows = c->numel / N;
#pragma omp parallel for if (c->numel > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float x[COLS_AT_ONCE], w[COLS_AT_ONCE];
        for (int64_t j0 = 0; j0 < N; j0 += COLS_AT_ONCE) {
            int64_t n = imin(COLS_AT_ONCE, N - j0), at = r * N + j0;
            to_f32(x, c->data, c->dtype, at, n);
            to_f32(w, v->data, v->dtype, e == EPI_DGELU ? at : j0, n);
            if (e == EPI_DGELU) {
                for (int64_t j = 0; j < n; j++) x[j] = x[j] * gelu_gradf(w[j]);
                from_f32(c->data, c->dtype, at, x, n);
                continue;
            }
            for (int64_t j = 0; j < n; j++) x[j] = x[j] + w[j];
            from_f32(c->data, c->dtype, at, x, n);
            if (e == EPI_BIAS) continue;
            to_f32(x, c->data, c->dtype, at, n);  // the GELU reads the sum as stored
            for (int64_t j = 0; j < n; j++) x[j] = geluf(x[j]);
            from_f32(y->data, y->dtype, at, x, n);
        }
    }
}

void cpu_matmul_bias(const KCall *k)
{
    KCall m = product(k, 0);
    cpu_matmul(&m);
    epilogue(EPI_BIAS, &k->out[0], &k->in[2], NULL);
}

/* out[0] = gelu(pre), out[1] = pre = a b + bias: the product goes into pre's buffer. */
void cpu_matmul_bias_gelu(const KCall *k)
{
    KCall m = product(k, 1);
    cpu_matmul(&m);
    epilogue(EPI_BIAS_GELU, &k->out[1], &k->in[2], &k->out[0]);
}

void cpu_matmul_dgelu_bgrad(const KCall *k)
{
    KCall m = product(k, 0);
    cpu_matmul(&m);
    epilogue(EPI_DGELU, &k->out[0], &k->in[2], NULL);
    row_sums(&k->out[0], &k->out[1]);
}

/* db: the reduced operand as it is stored, [K, len] (b untransposed for side 1, a under
 * ta for side 0), its rows summed. */
void cpu_matmul_bgrad(const KCall *k)
{
    int side = k_int(k, 4), t = k_int(k, side ? 3 : 2);
    KCHECK((side == 0 || side == 1) && t == !side && k->in[side].rank == 2,
           "matmul_bgrad: side %d with %s (the reduced operand stored [K, len])", side, t ? "it transposed" : "no ta");
    KCall m = product(k, 0);
    cpu_matmul(&m);
    row_sums(&k->in[side], &k->out[1]);
}
