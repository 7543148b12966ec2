/* codegen/cuda_gemm.c: matmul as cuBLAS GEMM instructions (PlanCuda GEMM records).
 *
 * The geometry is runtime/cpu/matmul.c's, step for step: matmul(a, b, ta, tb) =
 * torch.matmul(op(a), op(b)); a 1-D a is a row [1, K], a 1-D b a column [K, 1]; batch
 * dims broadcast like numpy; when b has no batch dims and a is not transposed, a's batch
 * folds into M and the call is one GEMM. Otherwise the output's batch dims are merged
 * where a, b and c all walk them as one (so [B, H] batches of contiguous operands are one
 * dim), the innermost merged dim becomes one strided batched call (stride 0 where an
 * operand broadcasts), and every index of the dims outside it is one more GEMM, with
 * element offsets a_off, b_off, c_off. Transposes are the GEMM's flags and leading
 * dimensions, never copies. The dtypes are the operands' (equal: the shape rule says so);
 * the runtime accumulates in f32.
 *
 * The GEMM epilogue ops (passes/epilogue.c) are one GEMM each (their shape rule says so:
 * b a matrix, a's batch folded) with a PlanEpilogue and its bias and aux tensors, which
 * the CUDA backend runs as one cublasLtMatmul; matmul_bias_add and matmul_add add their
 * residual as cuBLASLt's C (beta 1), the op's output its D.
 */
#include "cuda.h"

enum { MAX_GEMMS = 65536 };  // instructions one matmul may take

/* One merged batch dim: its size and each operand's stride along it (elements). */
typedef struct {
    int64_t size, sa, sb, sc;
} BatchDim;

/* Strides of t's first nb_t dims (its batch dims) right-aligned into nb dims; 0 where t
 * broadcasts. `mat` is the elements of one of t's matrices. */
static void batch_strides(const Value *t, int nb_t, int64_t mat, int nb, int64_t *st)
{
    int64_t s = mat;
    for (int i = 1; i <= nb; i++) {
        int d = nb_t - i;
        st[nb - i] = d >= 0 && t->shape[d] != 1 ? s : 0;
        if (d >= 0) s *= t->shape[d];
    }
}

/* The output's batch dims, innermost first, unit dims dropped and neighbours merged
 * where every operand continues its stride. Returns how many. */
static int merge_batch(const int64_t *shape, const int64_t *sa, const int64_t *sb, const int64_t *sc, int nb, BatchDim *out)
{
    int n = 0;
    for (int d = nb - 1; d >= 0; d--) {
        if (shape[d] == 1) continue;
        BatchDim *q = n ? &out[n - 1] : NULL;
        if (q && sa[d] == q->sa * q->size && sb[d] == q->sb * q->size && sc[d] == q->sc * q->size) {
            q->size *= shape[d];
            continue;
        }
        out[n++] = (BatchDim){shape[d], sa[d], sb[d], sc[d]};
    }
    return n;
}

static int fits_int(const CuGemm *g)
{
    const int64_t v[] = {g->m, g->n, g->k, g->lda, g->ldb, g->ldc, g->batch};
    for (int i = 0; i < 7; i++)
        if (v[i] < 1 || v[i] > INT32_MAX) return 0;
    return 1;
}

static int emit(CuCtx *c, const CuGemm *g)
{
    if (!fits_int(g))
        return cu_fail(c, "GEMM m %lld, n %lld, k %lld, batch %lld does not fit cuBLAS's int dims", (long long)g->m,
                       (long long)g->n, (long long)g->k, (long long)g->batch);
    return cu_gemm(c, g);
}

/* The GEMM of the current node's product op(A) @ op(B) into C, as far as one call goes:
 * m, n, k, leading dims and one batch's strides. */
static int geometry(CuCtx *c, int A_id, int B_id, int C_id, CuGemm *out)
{
    const Graph *g = c->g;
    const Node *node = ir_node(g, c->node);
    CuGemm gm = {.A = A_id, .B = B_id, .C = C_id, .batch = 1};
    const Value *A = ir_value(g, gm.A), *B = ir_value(g, gm.B);
    int ra = A->rank, rb = B->rank;
    gm.ta = ra >= 2 && ir_attr_int(g, node, "ta", 0), gm.tb = rb >= 2 && ir_attr_int(g, node, "tb", 0);
    int64_t M = 1, K = A->shape[ra - 1], N = 1, Kb = B->shape[0];
    if (ra >= 2) M = A->shape[ra - (gm.ta ? 1 : 2)], K = A->shape[ra - (gm.ta ? 2 : 1)];
    if (rb >= 2) Kb = B->shape[rb - (gm.tb ? 1 : 2)], N = B->shape[rb - (gm.tb ? 2 : 1)];
    if (K != Kb) return cu_fail(c, "inner dims differ (%lld vs %lld)", (long long)K, (long long)Kb);
    gm.lda = A->shape[ra - 1], gm.ldb = rb == 1 ? 1 : B->shape[rb - 1];
    gm.m = M, gm.n = N, gm.k = K, gm.ldc = N;
    gm.stride_a = M * K, gm.stride_b = K * N, gm.stride_c = M * N;
    *out = gm;
    return 0;
}

/* An epilogue op: its product (output `into`) as one GEMM with epilogue epi, plus input r
 * when r >= 0 (beta 1). */
static int epilogue_r(CuCtx *c, int into, PlanEpilogue epi, int bias, int aux, int r)
{
    CuGemm gm;
    if (geometry(c, cu_in_id(c, 0), cu_in_id(c, 1), cu_out_id(c, into), &gm)) return -1;
    const Value *A = cu_inv(c, 0);
    if (!gm.ta && cu_inv(c, 1)->rank == 2) gm.m = ir_numel(A) / gm.k;  // a's batch folded into M
    gm.stride_a = gm.m * gm.k, gm.stride_c = gm.m * gm.n;
    gm.epi = epi, gm.bias = bias, gm.aux = aux, gm.beta = r >= 0, gm.r = r >= 0 ? r : 0;
    return emit(c, &gm);
}

static int epilogue(CuCtx *c, int into, PlanEpilogue epi, int bias, int aux)
{
    return epilogue_r(c, into, epi, bias, aux, -1);
}

int cuda_matmul_bias(CuCtx *c) { return epilogue(c, 0, PLAN_EPI_BIAS, cu_in_id(c, 2), 0); }
int cuda_matmul_bias_gelu(CuCtx *c) { return epilogue(c, 0, PLAN_EPI_GELU_AUX_BIAS, cu_in_id(c, 2), cu_out_id(c, 1)); }
int cuda_matmul_dgelu_bgrad(CuCtx *c) { return epilogue(c, 0, PLAN_EPI_DGELU_BGRAD, cu_out_id(c, 1), cu_in_id(c, 2)); }
int cuda_matmul_bias_add(CuCtx *c) { return epilogue_r(c, 0, PLAN_EPI_BIAS, cu_in_id(c, 2), 0, cu_in_id(c, 3)); }
int cuda_matmul_add(CuCtx *c) { return epilogue_r(c, 0, PLAN_EPI_NONE, 0, 0, cu_in_id(c, 2)); }
int cuda_matmul_bgrad(CuCtx *c)
{
    int side = (int)ir_attr_int(c->g, cu_node(c), "side", 1);
    return epilogue(c, 0, side ? PLAN_EPI_BGRAD_B : PLAN_EPI_BGRAD_A, cu_out_id(c, 1), 0);
}

int cuda_matmul(CuCtx *c)
{
    const Graph *g = c->g;
    const Node *node = ir_node(g, c->node);
    CuGemm gm;
    if (geometry(c, ir_in(g, node, 0), ir_in(g, node, 1), ir_out(g, node, 0), &gm)) return -1;
    const Value *A = ir_value(g, gm.A), *B = ir_value(g, gm.B);
    int ra = A->rank, rb = B->rank;
    int64_t M = gm.m, K = gm.k, N = gm.n;
    if (ir_numel(ir_value(g, gm.C)) == 0) return 0;

    int ba = ra > 2 ? ra - 2 : 0, bb = rb > 2 ? rb - 2 : 0, nb = ba > bb ? ba : bb;
    if (bb == 0 && !gm.ta) {  // fold a's batch into M: one GEMM
        gm.m = ir_numel(A) / K, gm.stride_a = gm.m * K, gm.stride_c = gm.m * N;
        return emit(c, &gm);
    }
    int64_t shape[IR_MAX_RANK], sa[IR_MAX_RANK], sb[IR_MAX_RANK], sc[IR_MAX_RANK], s = M * N;
    for (int i = 1; i <= nb; i++) {
        int64_t da = i <= ba ? A->shape[ba - i] : 1, db = i <= bb ? B->shape[bb - i] : 1;
        if (da != db && da != 1 && db != 1) return cu_fail(c, "batch dims do not broadcast");
        shape[nb - i] = da == 1 ? db : da;
        sc[nb - i] = s;
        s *= shape[nb - i];
    }
    batch_strides(A, ba, M * K, nb, sa);
    batch_strides(B, bb, K * N, nb, sb);
    BatchDim dims[IR_MAX_RANK];
    int nd = merge_batch(shape, sa, sb, sc, nb, dims);
    if (nd == 0) return emit(c, &gm);  // every batch dim is 1

    /* dims[0] is one strided call; every index of dims[1..] is another. */
    gm.batch = dims[0].size, gm.stride_a = dims[0].sa, gm.stride_b = dims[0].sb, gm.stride_c = dims[0].sc;
    int64_t calls = 1;
    for (int d = 1; d < nd; d++) calls *= dims[d].size;
    if (calls > MAX_GEMMS) return cu_fail(c, "%lld GEMM calls for one matmul (at most %d)", (long long)calls, MAX_GEMMS);
    for (int64_t call = 0; call < calls; call++) {
        int64_t rest = call;
        gm.a_off = gm.b_off = gm.c_off = 0;
        for (int d = 1; d < nd; d++) {  // dims[1] varies fastest: the order C is laid out in
            int64_t j = rest % dims[d].size;
            rest /= dims[d].size;
            gm.a_off += j * dims[d].sa, gm.b_off += j * dims[d].sb, gm.c_off += j * dims[d].sc;
        }
        if (emit(c, &gm)) return -1;
    }
    return 0;
}
