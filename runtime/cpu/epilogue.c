/* runtime/cpu/epilogue.c: the GEMM epilogue ops (passes/epilogue.c) as cuBLASLt computes
 * them: the epilogue on the product's f32 values (cpu_matmul_epi), each output rounded
 * once to its dtype: C = bias + a b; gelu(bias + a b) and the sum itself (its second
 * output); gelu'(x) * (a b); (a b + bias) + r and a b + r (a residual r: cuBLASLt's C
 * with beta 1, which cuBLASLt adds before the bias, so the f32 sums agree to rounding). A
 * bias gradient is then cpu_sum_to's, in its fixed order, of the stored GELU gradient (or
 * of dy). In f32 this is the separate ops' arithmetic, so a plan with the rewrite trains
 * bit for bit as one without it (but for the residual's association, x + (a w + bias),
 * torch's); in 16 bits the separate ops round the product before the bias add, the sum
 * before the GELU and before the residual's add, where these round once.
 *
 * Attributes by position: ta and tb follow the tensors (matmul_bias (a, b, bias, ta, tb): ta
 * attr[3], tb attr[4]; matmul_bias_add (a, b, bias, r, ...): attr[4], [5]); matmul_bgrad
 * (a, b, ta, tb, side): ta attr[2], tb attr[3], side attr[4]. The workspace is the product's (cpu_work_matmul).
 */
#include "cpu_impl.h"

#define COLS_AT_ONCE 256  // columns of a row staged as f32 on the stack

/* The matmul call of op call k: its two operands, output `out` of k, k's ta and tb. */
static KCall product(const KCall *k, int out)
{
    int at = k->n_in;  // ta and tb follow the tensors
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

typedef enum { EPI_BIAS, EPI_BIAS_GELU, EPI_DGELU, EPI_ADD } Epi;

typedef struct {
    Epi e;
    const KTensor *v, *aux;  // v: the bias [N] or the GELU's input (DGELU); aux: where the sum goes (BIAS_GELU)
    const KTensor *r;        // a residual added last (matmul_bias_add, matmul_add), or NULL
    int64_t N;
} EpiCtx;

/* On the f32 product c, n values from C's flat element `at` (inside one row): BIAS c +=
 * bias; BIAS_GELU: aux = c + bias (rounded), c = gelu(c + bias); DGELU: c *= gelu'(x);
 * ADD: nothing but the residual; then, with a residual r, c += r (after the bias: the
 * unfused x + (a w + b), so f32 plans train bit for bit as without the rewrite).
 * Vectorized as the elementwise kernels are (KSIMD, VEC_LOOP; the same arithmetic at any
 * width): scalar, the GELU's exp made the fused ops slower than the GEMM and a GELU apart. */
KSIMD static void epilogue(const void *ctx, float *c, int64_t at, int64_t n)
{
    const EpiCtx *x = ctx;
    float w[COLS_AT_ONCE];
    for (int64_t j0 = 0; j0 < n; j0 += COLS_AT_ONCE) {
        int64_t m = imin(COLS_AT_ONCE, n - j0);
        float *y = c + j0;
        if (x->e != EPI_ADD) to_f32(w, x->v->data, x->v->dtype, x->e == EPI_DGELU ? at + j0 : (at + j0) % x->N, m);
        if (x->e == EPI_DGELU) {
            VEC_LOOP for (int64_t j = 0; j < m; j++) y[j] = y[j] * gelu_gradf(w[j]);
        } else if (x->e != EPI_ADD) {
            VEC_LOOP for (int64_t j = 0; j < m; j++) y[j] = y[j] + w[j];
        }
        if (x->e == EPI_BIAS_GELU) {
            from_f32(x->aux->data, x->aux->dtype, at + j0, y, m);
            VEC_LOOP for (int64_t j = 0; j < m; j++) y[j] = geluf(y[j]);
        }
        if (!x->r) continue;
        to_f32(w, x->r->data, x->r->dtype, at + j0, m);
        VEC_LOOP for (int64_t j = 0; j < m; j++) y[j] = y[j] + w[j];
    }
}

static void run(const KCall *k, Epi e, const KTensor *v, const KTensor *aux, const KTensor *r)
{
    KCall m = product(k, 0);
    EpiCtx x = {e, v, aux, r, k->out[0].shape[k->out[0].rank - 1]};
    cpu_matmul_epi(&m, &(CpuMmEpi){epilogue, &x});
}

void cpu_matmul_bias(const KCall *k) { run(k, EPI_BIAS, &k->in[2], NULL, NULL); }

/* out[0] = gelu(pre), out[1] = pre = a b + bias. */
void cpu_matmul_bias_gelu(const KCall *k) { run(k, EPI_BIAS_GELU, &k->in[2], &k->out[1], NULL); }

void cpu_matmul_dgelu_bgrad(const KCall *k)
{
    run(k, EPI_DGELU, &k->in[2], NULL, NULL);
    row_sums(&k->out[0], &k->out[1]);
}

/* (a b + bias) + r, and a b + r: r never shares the output's bytes (the plan's C and D). */
void cpu_matmul_bias_add(const KCall *k) { run(k, EPI_BIAS, &k->in[2], NULL, &k->in[3]); }
void cpu_matmul_add(const KCall *k) { run(k, EPI_ADD, NULL, NULL, &k->in[2]); }

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
