/* runtime/cpu/matmul.c: matmul(a, b, ta, tb) = torch.matmul(op(a), op(b)), where op
 * swaps the last two dims when its flag is set (a is stored [..., K, M] under ta).
 *
 * Every product is cblas_sgemm straight on the operands' storage: transposes become
 * CblasTrans and leading dimensions, never copies. A 1-D a is a row vector [1, K], a
 * 1-D b a column vector [K, 1]; the output's memory is the same with or without the
 * dropped unit dim. Batch dims broadcast like numpy. When b has no batch dims and a is
 * not transposed, a's batch folds into M and the whole call is one GEMM (the linear
 * layer case). Otherwise one GEMM per batch: small ones run in parallel, one per
 * thread, below OpenBLAS's own threading threshold (so it stays single-threaded
 * inside our parallel region); large ones run in turn and OpenBLAS threads each.
 * OpenBLAS splits a GEMM over M and N, never K, so results are reproducible.
 */
#include <cblas.h>

#include "cpu_impl.h"

/* OpenBLAS runs a GEMM of m*n*k <= 65536 * 4 on the calling thread. */
#define GEMM_SERIAL_MNK 262144.0

typedef struct {
    int nb;                     // batch dims of the output
    int64_t shape[K_MAX_RANK];  // the output's batch shape
    int64_t sa[K_MAX_RANK];     // a's stride per batch dim (elements), 0 if broadcast
    int64_t sb[K_MAX_RANK];
} Batch;

/* Strides of t's first tb dims (its batch dims) right-aligned into nb dims. */
static void batch_strides(const KTensor *t, int tb, int64_t mat, int nb, int64_t *st)
{
    int64_t s = mat;
    for (int i = 1; i <= nb; i++) {
        int d = tb - i;
        st[nb - i] = d >= 0 && t->shape[d] != 1 ? s : 0;
        if (d >= 0) s *= t->shape[d];
    }
}

void cpu_matmul(const KCall *k)
{
    const KTensor *A = &k->in[0], *B = &k->in[1];
    KCHECK(A->dtype == KT_F32 && B->dtype == KT_F32, "matmul: unsupported dtypes %d, %d", A->dtype, B->dtype);
    int ta = A->rank >= 2 && k_int(k, 2), tb = B->rank >= 2 && k_int(k, 3);
    int ra = A->rank, rb = B->rank;
    int64_t M = 1, K = A->shape[ra - 1], Kb = B->shape[0], N = 1;
    if (ra >= 2) M = A->shape[ra - (ta ? 1 : 2)], K = A->shape[ra - (ta ? 2 : 1)];
    if (rb >= 2) Kb = B->shape[rb - (tb ? 1 : 2)], N = B->shape[rb - (tb ? 2 : 1)];
    KCHECK(K == Kb, "matmul: inner dims differ (%lld vs %lld)", (long long)K, (long long)Kb);
    int64_t lda = A->shape[ra - 1], ldb = rb == 1 ? 1 : B->shape[rb - 1];
    const float *a = fdata(A), *b = fdata(B);
    float *c = fdata(&k->out[0]);
    CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;

    int ba = ra > 2 ? ra - 2 : 0, bb = rb > 2 ? rb - 2 : 0;
    Batch p = {.nb = ba > bb ? ba : bb};
    int64_t nbatch = 1;
    for (int i = 1; i <= p.nb; i++) {
        int64_t da = i <= ba ? A->shape[ba - i] : 1, db = i <= bb ? B->shape[bb - i] : 1;
        KCHECK(da == db || da == 1 || db == 1, "matmul: batch dims do not broadcast (%lld vs %lld)", (long long)da,
               (long long)db);
        p.shape[p.nb - i] = da == 1 ? db : da;
        nbatch *= p.shape[p.nb - i];
    }
    if (bb == 0 && !ta) {  // fold a's batch into M: one GEMM
        int64_t Mall = A->numel / K;
        cblas_sgemm(CblasRowMajor, opa, opb, (int)Mall, (int)N, (int)K, 1.0f, a, (int)lda, b, (int)ldb, 0.0f, c, (int)N);
        return;
    }
    batch_strides(A, ba, M * K, p.nb, p.sa);
    batch_strides(B, bb, K * N, p.nb, p.sb);
    int small = (double)M * (double)N * (double)K <= GEMM_SERIAL_MNK;
#pragma omp parallel for if (small && nbatch > 1) schedule(static)
    for (int64_t i = 0; i < nbatch; i++) {
        int64_t oa = 0, ob = 0, rem = i;
        for (int d = p.nb - 1; d >= 0; d--) {
            int64_t j = rem % p.shape[d];
            rem /= p.shape[d];
            oa += j * p.sa[d], ob += j * p.sb[d];
        }
        cblas_sgemm(CblasRowMajor, opa, opb, (int)M, (int)N, (int)K, 1.0f, a + oa, (int)lda, b + ob, (int)ldb, 0.0f,
                    c + i * M * N, (int)N);
    }
}
