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
 * OpenBLAS splits a GEMM over M and N, never K, so results are reproducible run to
 * run; but a large GEMM's bits do change with OpenBLAS's own thread count (0.3.21, f32
 * as much as 16-bit), so only runs at equal thread counts compare bit for bit.
 *
 * One pool of threads: when OpenBLAS is set to one thread (rt_set_threads does it, so
 * fsexec always runs so), a large GEMM is split here, over M (or over N when N is at
 * least 4 M, a logits or MLP-up product of a few rows, or when K is at least 3 times
 * both: the head's and the MLP's input gradients), into one piece per OpenMP thread,
 * each a single-threaded cblas_sgemm on its block of C (gemm). The rule is measured:
 * on GPT-2's shapes at B T = 256 (OpenBLAS 0.3.21, Zen 4, 2 threads), halves of M ran
 * at 1.05 to 1.6 times the rate of halves of N on the other shapes, and 3 to 15%
 * slower on those. OpenBLAS's pthreads build otherwise keeps a second pool whose
 * spinning threads fight OpenMP's for the cores after every switch between a GEMM and
 * the elementwise ops around it; on two shared cores that costs more than the GEMMs.
 * The pieces follow from the shape and the thread count alone, so as with OpenBLAS's own
 * threading, runs at equal thread counts agree bit for bit (OpenBLAS picks its kernels
 * by size: a piece's bits need not be the whole product's).
 *
 * 16-bit operands are converted to f32 in the workspace and multiplied by the same
 * cblas_sgemm calls (accumulation in f32), C rounded back once. Groups of whole
 * batches go together while they fit; a product too big for the workspace goes in
 * panels: a block of columns of op(B) converted once, then blocks of rows of op(A)
 * against it, each panel of C rounded as it is done. Panel sizes follow from the
 * workspace size alone, never the thread count.
 */
#include <cblas.h>

#include "cpu_impl.h"

/* OpenBLAS runs a GEMM of m*n*k <= 65536 * 4 on the calling thread. */
#define GEMM_SERIAL_MNK 262144.0

/* Whether OpenBLAS runs an M x N x K GEMM on the calling thread: too small to split. */
static int one_thread(int64_t M, int64_t N, int64_t K) { return (double)M * (double)N * (double)K <= GEMM_SERIAL_MNK; }

/* C [M, N] (row stride ldc) = op(A) op(B), on every OpenMP thread when it is large, we
 * are not inside a parallel region, and OpenBLAS would not thread it itself. */
static void gemm(CBLAS_TRANSPOSE opa, CBLAS_TRANSPOSE opb, int64_t M, int64_t N, int64_t K, float alpha,
                 const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc)
{
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (nt < 2 || one_thread(M, N, K) || openblas_get_num_threads() != 1) {
        cblas_sgemm(CblasRowMajor, opa, opb, (int)M, (int)N, (int)K, alpha, a, (int)lda, b, (int)ldb, 0.0f, c,
                    (int)ldc);
        return;
    }
    int by_n = N >= 4 * M || K >= 3 * (M > N ? M : N);
    int64_t len = by_n ? N : M, piece = (len + nt - 1) / nt;
    piece = (piece + 15) / 16 * 16;  // whole vector blocks of the kernels
    int64_t pieces = (len + piece - 1) / piece;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < pieces; i++) {
        int64_t at = i * piece, w = len - at < piece ? len - at : piece;
        if (by_n)  // columns [at, at + w) of op(B) and C
            cblas_sgemm(CblasRowMajor, opa, opb, (int)M, (int)w, (int)K, alpha, a, (int)lda,
                        b + (opb == CblasNoTrans ? at : at * ldb), (int)ldb, 0.0f, c + at, (int)ldc);
        else       // rows [at, at + w) of op(A) and C
            cblas_sgemm(CblasRowMajor, opa, opb, (int)w, (int)N, (int)K, alpha,
                        a + (opa == CblasNoTrans ? at * lda : at), (int)lda, b, (int)ldb, 0.0f, c + at * ldc,
                        (int)ldc);
    }
}

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

/* A matmul call's geometry: C [nbatch, M, N] = op(A) [M, K] op(B) [K, N] per batch. */
typedef struct {
    int ta, tb, fold;
    int64_t M, N, K, lda, ldb, nbatch;
    Batch p;
} Geom;

static void geometry(const KCall *k, Geom *g)
{
    const KTensor *A = &k->in[0], *B = &k->in[1];
    int ra = A->rank, rb = B->rank;
    g->ta = ra >= 2 && k_int(k, 2), g->tb = rb >= 2 && k_int(k, 3);
    g->M = 1, g->K = A->shape[ra - 1], g->N = 1;
    int64_t Kb = B->shape[0];
    if (ra >= 2) g->M = A->shape[ra - (g->ta ? 1 : 2)], g->K = A->shape[ra - (g->ta ? 2 : 1)];
    if (rb >= 2) Kb = B->shape[rb - (g->tb ? 1 : 2)], g->N = B->shape[rb - (g->tb ? 2 : 1)];
    KCHECK(g->K == Kb, "matmul: inner dims differ (%lld vs %lld)", (long long)g->K, (long long)Kb);
    g->lda = A->shape[ra - 1], g->ldb = rb == 1 ? 1 : B->shape[rb - 1];
    int ba = ra > 2 ? ra - 2 : 0, bb = rb > 2 ? rb - 2 : 0;
    g->p = (Batch){.nb = ba > bb ? ba : bb};
    g->nbatch = 1;
    for (int i = 1; i <= g->p.nb; i++) {
        int64_t da = i <= ba ? A->shape[ba - i] : 1, db = i <= bb ? B->shape[bb - i] : 1;
        KCHECK(da == db || da == 1 || db == 1, "matmul: batch dims do not broadcast (%lld vs %lld)", (long long)da,
               (long long)db);
        g->p.shape[g->p.nb - i] = da == 1 ? db : da;
        g->nbatch *= g->p.shape[g->p.nb - i];
    }
    g->fold = bb == 0 && !g->ta;
    if (g->fold) {  // fold a's batch into M: one GEMM
        g->M = A->numel / g->K, g->nbatch = 1;
        return;
    }
    batch_strides(A, ba, g->M * g->K, g->p.nb, g->p.sa);
    batch_strides(B, bb, g->K * g->N, g->p.nb, g->p.sb);
}

/* Offsets of batch i's a and b (elements). */
static void batch_at(const Geom *g, int64_t i, int64_t *oa, int64_t *ob)
{
    *oa = 0, *ob = 0;
    if (g->fold) return;
    for (int d = g->p.nb - 1; d >= 0; d--) {
        int64_t j = i % g->p.shape[d];
        i /= g->p.shape[d];
        *oa += j * g->p.sa[d], *ob += j * g->p.sb[d];
    }
}

/* n batches of g's GEMM go one per thread when there are several and each is too small
 * to split; otherwise they run in turn, outside any parallel region, and gemm splits
 * each. (An `if (false)` region around them would still be a region: libgomp would count
 * gemm's inside it as nested and start fresh threads for it at every call.) */
static int per_thread(const Geom *g, int64_t n) { return n > 1 && one_thread(g->M, g->N, g->K); }

static void batch_gemm(const Geom *g, CBLAS_TRANSPOSE opa, CBLAS_TRANSPOSE opb, const float *a, const float *b,
                       float *c, int64_t i)
{
    int64_t oa, ob;
    batch_at(g, i, &oa, &ob);
    gemm(opa, opb, g->M, g->N, g->K, 1.0f, a + oa, g->lda, b + ob, g->ldb, c + i * g->M * g->N, g->N);
}

/* ---- 16-bit --------------------------------------------------------------------------- */

#define PANEL_MIN 16  // rows and columns of a panel, at least (or all there are)

/* Workspace floats per batch (operands and C), and for the smallest panels. */
CpuWork cpu_work_matmul(const KCall *k)
{
    if (!lowp_call(k)) return (CpuWork){0, 0};
    Geom g;
    geometry(k, &g);
    int64_t per = g.M * g.K + g.K * g.N + g.M * g.N, mb = imin(g.M, PANEL_MIN), nb = imin(g.N, PANEL_MIN);
    return (CpuWork){(size_t)(imin(per, g.K * (mb + nb) + mb * nb)), (size_t)(per * g.nbatch)};
}

/* dst [rows, cols] = src [r0.., c0..] of a row-major matrix with leading dim ld, as f32. */
static void gather(float *dst, const void *src, int dtype, int64_t base, int64_t ld, int64_t rows, int64_t cols)
{
#pragma omp parallel for if (rows * cols > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) to_f32(dst + r * cols, src, dtype, base + r * ld, cols);
}

/* Groups of whole batches: operands converted as they lie, the f32 path's calls, C rounded. */
/* The epilogue e (or none) on f32 values c of C, rows of n from flat element `at`, each
 * run inside one row of C. */
static void epilogue_rows(const CpuMmEpi *e, float *c, int64_t at, int64_t total, int64_t N)
{
    if (!e) return;
#pragma omp parallel for if (total > PAR_MIN) schedule(static)
    for (int64_t j = 0; j < total; j += N) e->fn(e->ctx, c + j, at + j, N);
}

static void matmul_groups(const KCall *k, const Geom *g, const CpuMmEpi *e)
{
    const KTensor *A = &k->in[0], *B = &k->in[1], *C = &k->out[0];
    int64_t M = g->M, N = g->N, K = g->K, sa = M * K, sb = K * N, sc = M * N;
    int64_t group = imin(g->nbatch, (int64_t)(k->work_floats / (size_t)(sa + sb + sc)));
    CBLAS_TRANSPOSE opa = g->ta ? CblasTrans : CblasNoTrans, opb = g->tb ? CblasTrans : CblasNoTrans;
    for (int64_t i0 = 0; i0 < g->nbatch; i0 += group) {
        int64_t n = imin(group, g->nbatch - i0);
        float *wa = k->work, *wb = wa + n * sa, *wc = wb + n * sb;
        if (n == 1) {
            int64_t oa, ob;
            batch_at(g, i0, &oa, &ob);
            to_f32_par(wa, A->data, A->dtype, oa, sa);
            to_f32_par(wb, B->data, B->dtype, ob, sb);
        } else {
#pragma omp parallel for if (n * (sa + sb) > PAR_MIN) schedule(static)
            for (int64_t j = 0; j < n; j++) {
                int64_t oa, ob;
                batch_at(g, i0 + j, &oa, &ob);
                to_f32(wa + j * sa, A->data, A->dtype, oa, sa);
                to_f32(wb + j * sb, B->data, B->dtype, ob, sb);
            }
        }
        if (per_thread(g, n)) {
#pragma omp parallel for schedule(static)
            for (int64_t j = 0; j < n; j++)
                gemm(opa, opb, M, N, K, 1.0f, wa + j * sa, g->lda, wb + j * sb, g->ldb, wc + j * sc, N);
        } else {
            for (int64_t j = 0; j < n; j++)
                gemm(opa, opb, M, N, K, 1.0f, wa + j * sa, g->lda, wb + j * sb, g->ldb, wc + j * sc, N);
        }
        epilogue_rows(e, wc, i0 * sc, n * sc, N);
        from_f32_par(C->data, C->dtype, i0 * sc, wc, n * sc);
    }
}

/* One batch too big for the workspace, in panels: columns [n0, n0 + nb) of op(B), then
 * rows [m0, m0 + mb) of op(A) against them. A panel that is contiguous in storage (rows
 * of A, or of B under tb) keeps its layout; the others are gathered untransposed. */
static void matmul_panels(const KCall *k, const Geom *g, int64_t i, const CpuMmEpi *e)
{
    const KTensor *A = &k->in[0], *B = &k->in[1], *C = &k->out[0];
    int64_t M = g->M, N = g->N, K = g->K, W = (int64_t)k->work_floats, oa, ob;
    batch_at(g, i, &oa, &ob);
    int64_t mb0 = imin(M, PANEL_MIN), nb = N;
    if (K * N + mb0 * (K + N) > W) {  // op(B) in column blocks: half the room, leaving mb0 rows
        nb = imin(N, imin(W / 2 / K, (W - mb0 * K) / (K + mb0)));
        nb = nb >= PANEL_MIN ? nb / PANEL_MIN * PANEL_MIN : nb;
    }
    int64_t mb = imin(M, (W - K * nb) / (K + nb));
    KCHECK(mb >= 1 && nb >= 1, "matmul: a workspace of %lld floats is too small for K = %lld", (long long)W, (long long)K);
    float *wb = k->work, *wa = wb + K * nb, *wc = wa + mb * K;
    for (int64_t n0 = 0; n0 < N; n0 += nb) {
        int64_t nw = imin(nb, N - n0);
        if (g->tb) to_f32_par(wb, B->data, B->dtype, ob + n0 * g->ldb, nw * K);  // [nw, K]
        else gather(wb, B->data, B->dtype, ob + n0, g->ldb, K, nw);             // [K, nw]
        for (int64_t m0 = 0; m0 < M; m0 += mb) {
            int64_t mw = imin(mb, M - m0);
            if (!g->ta) to_f32_par(wa, A->data, A->dtype, oa + m0 * g->lda, mw * K);  // [mw, K]
            else gather(wa, A->data, A->dtype, oa + m0, g->lda, K, mw);              // [K, mw]
            gemm(g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, mw, nw, K, 1.0f, wa,
                 g->ta ? mw : K, wb, g->tb ? K : nw, wc, nw);
#pragma omp parallel for if (mw * nw > PAR_MIN) schedule(static)
            for (int64_t r = 0; r < mw; r++) {
                int64_t at = i * M * N + (m0 + r) * N + n0;
                if (e) e->fn(e->ctx, wc + r * nw, at, nw);
                from_f32(C->data, C->dtype, at, wc + r * nw, nw);
            }
        }
    }
}

static void matmul_lowp(const KCall *k, const Geom *g, const CpuMmEpi *e)
{
    const KTensor *A = &k->in[0], *B = &k->in[1];
    KCHECK(A->dtype == B->dtype && k->out[0].dtype == A->dtype, "matmul: dtypes %d, %d -> %d", A->dtype, B->dtype,
           k->out[0].dtype);
    size_t least = cpu_work_matmul(k).least;
    KCHECK(k->work && k->work_floats >= least, "matmul: a 16-bit call needs a workspace of %zu floats, has %zu", least,
           k->work ? k->work_floats : 0);
    if ((size_t)(g->M * g->K + g->K * g->N + g->M * g->N) <= k->work_floats) {
        matmul_groups(k, g, e);
        return;
    }
    for (int64_t i = 0; i < g->nbatch; i++) matmul_panels(k, g, i, e);
}

/* ---- f32 ------------------------------------------------------------------------------ */

void cpu_matmul_epi(const KCall *k, const CpuMmEpi *e)
{
    const KTensor *A = &k->in[0], *B = &k->in[1];
    Geom g;
    geometry(k, &g);
    if (lowp_call(k)) {
        matmul_lowp(k, &g, e);
        return;
    }
    KCHECK(A->dtype == KT_F32 && B->dtype == KT_F32, "matmul: unsupported dtypes %d, %d", A->dtype, B->dtype);
    const float *a = fdata(A), *b = fdata(B);
    float *c = fdata(&k->out[0]);
    CBLAS_TRANSPOSE opa = g.ta ? CblasTrans : CblasNoTrans, opb = g.tb ? CblasTrans : CblasNoTrans;
    int64_t M = g.M, N = g.N, K = g.K;
    if (g.fold) {
        gemm(opa, opb, M, N, K, 1.0f, a, g.lda, b, g.ldb, c, N);
        epilogue_rows(e, c, 0, M * N, N);
        return;
    }
    if (per_thread(&g, g.nbatch)) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < g.nbatch; i++) batch_gemm(&g, opa, opb, a, b, c, i);
    } else {
        for (int64_t i = 0; i < g.nbatch; i++) batch_gemm(&g, opa, opb, a, b, c, i);
    }
    epilogue_rows(e, c, 0, g.nbatch * M * N, N);
}

void cpu_matmul(const KCall *k) { cpu_matmul_epi(k, NULL); }
