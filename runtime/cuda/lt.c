/* runtime/cuda/lt.c: the GEMMs with an epilogue (passes/epilogue.c: bias, GELU, their
 * gradients) or a residual added (beta 1: cuBLASLt's C the residual, its D the plan's C,
 * two buffers) as cublasLtMatmul calls. Everything a call needs (the operation and layout
 * descriptors, the epilogue's pointers, the algorithm cuBLASLt's heuristic picks) is made
 * once when the backend starts (cuda_lt_make), so a step only calls cublasLtMatmul, which
 * allocates nothing and can be captured in a CUDA graph. The workspace is cuBLAS's.
 *
 * The call is schedule.h's column-major form (cuBLAS's A the plan's B): the bias runs along
 * cuBLAS's m, aux has C's leading dimension, the bias gradient of the plan's B is BGRADA
 * (cuBLASLt takes it of an untransposed A), of its A BGRADB (of a transposed B); plan_check
 * holds those layouts. cuBLASLt computes in f32 and rounds C, aux and the bias gradient
 * once; its bias gradient is a reduction whose order cuBLASLt does not document, so unlike
 * the CPU backend's (sum_to's fixed order) it is not promised bit-reproducible across
 * algorithms, only across runs of one algorithm on one GPU. A GEMM that cuBLASLt has no
 * algorithm for is an error when the backend starts, naming the op (the plan compiled
 * with --fuse_gemm 0 has none; with --fuse_residual 0, no beta 1).
 */
#include <stdio.h>

#include "cuda_impl.h"

struct CudaLtGemm {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
};

/* A GEMM this file runs: an epilogue, or a residual as C. */
static int lt_runs(const CsGemm *g) { return g->epilogue != CS_EPI_DEFAULT || g->beta; }

static cudaDataType lt_type(PlanDType t)
{
    return t == PLAN_DT_F16 ? CUDA_R_16F : t == PLAN_DT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

static cublasLtEpilogue_t lt_epilogue(CsEpilogue e)
{
    switch (e) {
    case CS_EPI_BIAS: return CUBLASLT_EPILOGUE_BIAS;
    case CS_EPI_GELU_AUX_BIAS: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case CS_EPI_DGELU_BGRAD: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case CS_EPI_BGRADA: return CUBLASLT_EPILOGUE_BGRADA;
    case CS_EPI_BGRADB: return CUBLASLT_EPILOGUE_BGRADB;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
    }
}

#define SET(b, desc, attr, v) BLAS_CHECK(b, cublasLtMatmulDescSetAttribute(desc, attr, &(v), sizeof(v)))

static int make_one(RtBackend *b, int32_t i, CudaLtGemm *l)
{
    const CsGemm *g = &b->s.gemms[i];
    cublasOperation_t ta = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epi = lt_epilogue(g->epilogue);
    cudaDataType ct = lt_type(g->c_dt);
    void *bias = (void *)(uintptr_t)(b->arena + (CUdeviceptr)g->bias);
    void *aux = (void *)(uintptr_t)(b->arena + (CUdeviceptr)g->aux);
    int64_t ld = g->ldc;
    BLAS_CHECK(b, cublasLtMatmulDescCreate(&l->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    SET(b, l->op, CUBLASLT_MATMUL_DESC_TRANSA, ta);
    SET(b, l->op, CUBLASLT_MATMUL_DESC_TRANSB, tb);
    SET(b, l->op, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
    if (epi != CUBLASLT_EPILOGUE_DEFAULT) {  // a residual alone (beta 1) has no bias
        SET(b, l->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
        SET(b, l->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, ct);
    }
    if (g->epilogue == CS_EPI_GELU_AUX_BIAS || g->epilogue == CS_EPI_DGELU_BGRAD) {
        SET(b, l->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
        SET(b, l->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ld);
        SET(b, l->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, ct);
    }
    /* cuBLAS's stored A is op(A)'s transpose under trans_a: k x m, else m x k (likewise B). */
    uint64_t ar = (uint64_t)(g->trans_a ? g->k : g->m), ac = (uint64_t)(g->trans_a ? g->m : g->k);
    uint64_t br = (uint64_t)(g->trans_b ? g->n : g->k), bc = (uint64_t)(g->trans_b ? g->k : g->n);
    BLAS_CHECK(b, cublasLtMatrixLayoutCreate(&l->a, lt_type(g->a_dt), ar, ac, g->lda));
    BLAS_CHECK(b, cublasLtMatrixLayoutCreate(&l->b, lt_type(g->b_dt), br, bc, g->ldb));
    BLAS_CHECK(b, cublasLtMatrixLayoutCreate(&l->c, ct, g->m, g->n, g->ldc));
    cublasLtMatmulPreference_t pref;
    BLAS_CHECK(b, cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = (size_t)b->info.blas_workspace;
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    cublasStatus_t st =
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(b->lt, l->op, l->a, l->b, l->c, l->c, pref, 1, &r, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found < 1) {
        char where[128];
        cs_op_where(b->plan, b->plan->cuda[i].op, where, sizeof where);
        snprintf(b->what_buf, sizeof b->what_buf, "%s: cuBLASLt has no algorithm for its GEMM's epilogue %d, beta %d "
                 "(compile with --fuse_gemm 0, or --fuse_residual 0 for beta 1)", where, (int)g->epilogue, g->beta);
        return cuda_fail(b, __FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic", b->what_buf);
    }
    l->algo = r.algo;
    return 0;
}

int cuda_lt_make(RtBackend *b)
{
    b->what = "setting up cuBLASLt";
    int32_t n = 0;
    for (int32_t i = 0; i < b->plan->n_cuda; i++) n += b->plan->cuda[i].kind == PLAN_CU_GEMM && lt_runs(&b->s.gemms[i]);
    if (!n) return 0;
    BLAS_CHECK(b, cublasLtCreate(&b->lt));
    if (!(b->lt_gemms = calloc((size_t)b->plan->n_cuda, sizeof *b->lt_gemms)))
        return cuda_fail(b, __FILE__, __LINE__, "calloc", "out of memory");
    for (int32_t i = 0; i < b->plan->n_cuda; i++)
        if (b->plan->cuda[i].kind == PLAN_CU_GEMM && lt_runs(&b->s.gemms[i]) && make_one(b, i, &b->lt_gemms[i]))
            return -1;
    return 0;
}

void cuda_lt_free(RtBackend *b)
{
    for (int32_t i = 0; b->lt_gemms && i < b->plan->n_cuda; i++) {
        CudaLtGemm *l = &b->lt_gemms[i];
        if (l->a) cublasLtMatrixLayoutDestroy(l->a);
        if (l->b) cublasLtMatrixLayoutDestroy(l->b);
        if (l->c) cublasLtMatrixLayoutDestroy(l->c);
        if (l->op) cublasLtMatmulDescDestroy(l->op);
    }
    free(b->lt_gemms);
    if (b->lt) cublasLtDestroy(b->lt);
}

int cuda_lt_gemm(RtBackend *b, int32_t i)
{
    const CsGemm *g = &b->s.gemms[i];
    const CudaLtGemm *l = &b->lt_gemms[i];
    static const float one = 1.0f, zero = 0.0f;
    void *d = (void *)(uintptr_t)(b->arena + (CUdeviceptr)g->c);
    const void *c = g->beta ? (const void *)(uintptr_t)(b->arena + (CUdeviceptr)g->r) : d;
    BLAS_CHECK(b, cublasLtMatmul(b->lt, l->op, &one, (const void *)(uintptr_t)(b->arena + (CUdeviceptr)g->a), l->a,
                                 (const void *)(uintptr_t)(b->arena + (CUdeviceptr)g->b), l->b, g->beta ? &one : &zero,
                                 c, l->c, d, l->c,
                                 &l->algo, (void *)(uintptr_t)b->blas_ws, (size_t)b->info.blas_workspace,
                                 (cudaStream_t)b->compute));
    return 0;
}
