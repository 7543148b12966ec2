/* codegen/cuda_attention.c: CUDA emitters of attention, attention_bwd and
 * attention_decode (the KV cache's write, then codegen/kernels/decode.cuh's kernel over
 * the caches with query row i at position pos + i; see the op's rule in ops/shape.c).
 * 16-bit attention and its backward with head dims D = Dv a multiple of 8 up to 128
 * run on tensor cores (codegen/cuda_flash.c, which says exactly what it takes); the
 * rest (fp32 plans, other head dims) runs here: flash attention in f32 on CUDA
 * cores, never a T x S matrix in memory. Semantics are
 * runtime/cpu/attention.c's:
 *   attention(q [BH, T, D], k [BKV, S, D], v [BKV, S, Dv], causal) -> o [BH, T, Dv] and
 *   lse [BH, T] (f32), the log-sum-exp of each row of scores s = q.k / sqrt(D); under
 *   causal (T == S) query i sees keys j <= i. Grouped-query attention: G = BH / BKV
 *   query slices in a row share kv slice bh / G.
 * attention_qkv(qkv, nh, nkv, causal) and its backward run the same kernels with the heads
 * read as column ranges of the QKV projection's rows (CuAtt's layouts; passes/packed_attn.c):
 * every address below is a layout's (qat, kat, vat, oat), and q, k, v (dq, dk, dv) are one
 * tensor at three column offsets.
 * 16-bit tensors are loaded as f32 into shared memory; every product, sum and softmax
 * is f32; each output is rounded once.
 *
 * Forward: a block of NW = 4 warps owns BQ = 4 * RPW query rows of one (batch, head)
 * slice: warp w owns rows w, w + 4, ..., and for each row its lanes hold the running
 * max m, sum l and Dv / 32 columns of the output (column lane + 32c). The block walks
 * tiles of 32 keys (causal: only up to its last row). For a tile, K goes to shared
 * memory, lane j scores key j against the warp's rows (q from shared memory, a
 * broadcast), the warp takes the tile's row max and sum of exp by shuffles (online
 * softmax: o and l scale by exp(m_old - m_new)) and puts the probabilities in shared
 * memory; then V replaces K there and o += P V, lane by lane over columns. At the end
 * o /= l and lse = m + log l. Masked and out-of-range keys score -inf, and rows and
 * keys past the end load as 0, so nothing reads past a tensor or makes a NaN (every
 * row sees key 0 in the first tile). Query tiles run longest first (causal).
 *
 * Backward: P = exp(s - lse) recomputed from the saved lse, dP = dO V^T,
 * dS = P * (dP - rowsum(dO * O)), dV = P^T dO, dK = dS^T Q / sqrt(D),
 * dQ = dS K / sqrt(D). Two kernels, no atomics: kernel 1 owns a tile of TB keys and
 * walks every query tile that sees it, accumulating dK and dV; kernel 2 owns a tile of
 * TB queries and walks its key tiles, accumulating dQ. Both recompute P and dS for a
 * (query tile, key tile) pair with one thread per element; under grouped-query attention
 * kernel 1 walks the query tiles of each of its kv slice's G query slices in turn; rowsum(dO * O) is taken per
 * query tile from dO (in shared memory) and O. Accumulators live in registers, thread t
 * owning elements t, t + 256, ... of its TB x D (or TB x Dv) block, each summed over
 * tiles in order: bitwise reproducible.
 *
 * Shared memory is static and at most SMEM_MAX: the emitter takes the largest tile
 * (forward RPW in 8, 4, 2, 1; backward TB in 32, 16, 8, 4) that fits, so head dims of
 * 128 run with BQ = 32 forward and TB = 16 backward, and up to about 300 with smaller
 * tiles; beyond, a clear error. Rows of shared tiles that are read across lanes have an
 * odd pitch (D | 1), so lanes fall in distinct banks.
 *
 * Where it sits: called by codegen_cuda (cuda_program.c) through the op table.
 */
#include <math.h>

#include "cuda_rows.h"

enum { SMEM_MAX = 48 * 1024 - 256 };  // static shared memory per block, bytes
enum { FWD_THREADS = 128, BWD_THREADS = 256, KEYS = 32, DECODE_WARPS = 8 };

/* The geometry both directions read from the node (cuda.h). */
typedef CuAtt Att;

static CuLay dense(int64_t rows, int64_t width) { return (CuLay){1, rows * width, 0, width}; }

/* q, k, v: inputs 0, 1, 2; kk: k's and v's input indices (attention_decode: the caches). */
static int att_geometry(CuCtx *c, const char *op, Att *a, int kk, int vv)
{
    const Value *q = cu_inv(c, 0), *k = cu_inv(c, kk), *v = cu_inv(c, vv);
    int r = q->rank;
    if (r < 2 || k->rank != r || v->rank != r) return cu_fail(c, "%s: q, k, v of rank >= 2 only", op);
    if (!dtype_is_float(q->dtype) || !dtype_is_float(k->dtype) || !dtype_is_float(v->dtype))
        return cu_fail(c, "%s: float q, k, v only", op);
    a->T = q->shape[r - 2], a->D = q->shape[r - 1], a->S = k->shape[r - 2], a->Dv = v->shape[r - 1];
    a->BH = ir_numel(q) / (a->T * a->D);
    int64_t bkv = ir_numel(k) / (a->S * a->D);
    if (a->BH % bkv || ir_numel(v) != bkv * a->S * a->Dv)
        return cu_fail(c, "%s: %lld query slices over %lld kv slices", op, (long long)a->BH, (long long)bkv);
    a->G = a->BH / bkv;
    a->causal = kk != 1 || ir_attr_int(c->g, cu_node(c), "causal", 0) != 0;
    a->scale = 1.0f / sqrtf((float)a->D);
    if (a->T > (1 << 30) || a->S > (1 << 30)) return cu_fail(c, "%s: sequences longer than 2^30", op);
    a->lq = dense(a->T, a->D), a->lk = dense(a->S, a->D), a->lv = dense(a->S, a->Dv), a->lo = dense(a->T, a->Dv);
    a->packed = 0, a->koff = a->voff = 0;
    a->in_o = 3, a->in_lse = 4, a->in_dout = 5;
    return 0;
}

/* attention_qkv's (and its backward's) geometry: qkv [..., T, (nh + 2 nkv) D] is input 0; bwd: o, lse, dout
 * are inputs 1, 2, 3. */
static int packed_geometry(CuCtx *c, const char *op, Att *a, int bwd)
{
    const Value *x = cu_inv(c, 0);
    int64_t nh = ir_attr_int(c->g, cu_node(c), "nh", 1), nkv = ir_attr_int(c->g, cu_node(c), "nkv", 1);
    int64_t T = x->shape[x->rank - 2], W = x->shape[x->rank - 1], D = W / (nh + 2 * nkv);
    if (!dtype_is_float(x->dtype) || nh < 1 || nkv < 1 || nh % nkv || W % (nh + 2 * nkv))
        return cu_fail(c, "%s: float qkv of nh + 2 nkv heads only", op);
    if (T > (1 << 30)) return cu_fail(c, "%s: sequences longer than 2^30", op);
    *a = (Att){.BH = ir_numel(x) / W / T * nh, .G = nh / nkv, .T = T, .S = T, .D = D, .Dv = D,
               .causal = ir_attr_int(c->g, cu_node(c), "causal", 0) != 0, .scale = 1.0f / sqrtf((float)D)};
    a->lq = (CuLay){nh, T * W, D, W}, a->lk = a->lv = (CuLay){nkv, T * W, D, W};
    a->lo = (CuLay){nh, T * nh * D, D, nh * D};
    a->packed = 1, a->koff = nh * D, a->voff = (nh + nkv) * D;
    a->in_o = bwd ? 1 : -1, a->in_lse = bwd ? 2 : -1, a->in_dout = bwd ? 3 : -1;
    return 0;
}

/* The node input that holds q (0), k (1) or v (2). */
static int qkv_in(const Att *a, int i) { return a->packed ? 0 : i; }

static int att_shape(CuCtx *c, const char *op, Att *a)
{
    if (att_geometry(c, op, a, 1, 2)) return -1;
    if (a->causal && a->T != a->S) return cu_fail(c, "%s: causal needs T == S (%lld, %lld)", op, (long long)a->T, (long long)a->S);
    return 0;
}

static int64_t odd(int64_t n) { return n | 1; }

/* The forward's kv tile pitch: K rows at odd(D), V rows at Dv, in one buffer. */
static int64_t kv_pitch(const Att *a) { return odd(a->D) > a->Dv ? odd(a->D) : a->Dv; }

/* A layout's address function: `name`(slice, row), elements. */
static char *lay_fn(CuCtx *c, const char *name, const CuLay *l)
{
    return cu_fmt(c,
                  "    auto %s = [](long long s, long long i) {\n"
                  "        return s / %lldLL * %lldLL + s %% %lldLL * %lldLL + i * %lldLL;\n"
                  "    };\n",
                  name, (long long)l->nh, (long long)l->b, (long long)l->nh, (long long)l->h, (long long)l->r);
}

/* The geometry every kernel states first; attention_qkv's pointers moved to k's and v's columns. */
static char *consts(CuCtx *c, const Att *a)
{
    return cu_fmt(c,
                  "    constexpr int T = %lld, S = %lld, D = %lld, DV = %lld, G = %lld;\n"
                  "    constexpr bool CAUSAL = %s;\n"
                  "    constexpr float SCALE = %s;\n"
                  "%s%s%s%s%s",
                  (long long)a->T, (long long)a->S, (long long)a->D, (long long)a->Dv, (long long)a->G,
                  a->causal ? "true" : "false", cu_float(c, a->scale), lay_fn(c, "qat", &a->lq),
                  lay_fn(c, "kat", &a->lk), lay_fn(c, "vat", &a->lv), lay_fn(c, "oat", &a->lo),
                  a->packed ? cu_fmt(c, "    k += %lldLL, v += %lldLL;\n", (long long)a->koff, (long long)a->voff)
                            : "");
}

/* ---- forward ------------------------------------------------------------------------ */

static int64_t fwd_smem(const Att *a, int rpw)
{
    int64_t bq = 4 * rpw;
    return 4 * (bq * a->D + KEYS * kv_pitch(a) + bq * KEYS);
}

/* s[g] += q row g . k row lane, for the D elements: float4 reads of q when they align. */
static const char *score_loop(CuCtx *c, const Att *a)
{
    if (a->D % 4)
        return "        for (int d = 0; d < D; d++) {\n"
               "            const float kd = kv[lane * KP + d];\n"
               "#pragma unroll\n"
               "            for (int g = 0; g < RPW; g++) s[g] += qs[(warp + 4 * g) * D + d] * kd;\n"
               "        }\n";
    return "        for (int d = 0; d < D; d += 4) {\n"
           "            const float k0 = kv[lane * KP + d], k1 = kv[lane * KP + d + 1];\n"
           "            const float k2 = kv[lane * KP + d + 2], k3 = kv[lane * KP + d + 3];\n"
           "#pragma unroll\n"
           "            for (int g = 0; g < RPW; g++) {\n"
           "                const float4 qv = *reinterpret_cast<const float4 *>(&qs[(warp + 4 * g) * D + d]);\n"
           "                s[g] += qv.x * k0;\n"
           "                s[g] += qv.y * k1;\n"
           "                s[g] += qv.z * k2;\n"
           "                s[g] += qv.w * k3;\n"
           "            }\n"
           "        }\n";
}

/* The forward kernel: attention's (q, k, v) -> (o, lse). */
static int fwd_kernel(CuCtx *c, const Att *a0)
{
    Att a = *a0;
    const char *op = "attention";
    int rpw = 8, cpl = (int)cu_cdiv(a.Dv, 32);
    while (rpw > 1 && (fwd_smem(&a, rpw) > SMEM_MAX || rpw * cpl > 64)) rpw /= 2;
    if (fwd_smem(&a, rpw) > SMEM_MAX || rpw * cpl > 64)
        return cu_fail(c, "%s: head dims D = %lld, Dv = %lld need %lld bytes of shared memory per block, over the %d the "
                          "CUDA kernels use (D, Dv up to about 300 fit)",
                       op, (long long)a.D, (long long)a.Dv, (long long)fwd_smem(&a, rpw), SMEM_MAX);
    int64_t nqt = cu_cdiv(a.T, 4 * rpw);
    const char *src = cu_fmt(c,
        "extern \"C\" __global__ void __launch_bounds__(128) KNAME(const %s *__restrict__ q, const %s *__restrict__ k, "
        "const %s *__restrict__ v, %s *__restrict__ o, float *__restrict__ lse)\n"
        "{\n"
        "%s"
        "    constexpr int RPW = %d, BQ = 4 * RPW, CPL = %d, KP = %lld, NQT = %lld;\n"
        "    __shared__ __align__(16) float qs[BQ * D];\n"
        "    __shared__ float kv[32 * %lld];\n"
        "    __shared__ float ps[BQ * 32];\n"
        "    const int lane = threadIdx.x %% 32, warp = threadIdx.x / 32;\n"
        "    const long long bh = blockIdx.x / NQT, bkv = bh / G;\n"
        "    const int i0 = (NQT - 1 - (int)(blockIdx.x %% NQT)) * BQ;\n"
        "    for (int e = threadIdx.x; e < BQ * D; e += 128)\n"
        "        qs[e] = i0 + e / D < T ? ld(q, qat(bh, i0 + e / D) + e %% D) : 0.f;\n"
        "    float m[RPW], l[RPW], acc[RPW][CPL];\n"
        "#pragma unroll\n"
        "    for (int g = 0; g < RPW; g++) {\n"
        "        m[g] = __int_as_float(0xff800000u), l[g] = 0.f;\n"
        "#pragma unroll\n"
        "        for (int cc = 0; cc < CPL; cc++) acc[g][cc] = 0.f;\n"
        "    }\n"
        "    const int jend = CAUSAL ? min(S, i0 + BQ) : S;\n"
        "    for (int j0 = 0; j0 < jend; j0 += 32) {\n"
        "        __syncthreads();  // the last tile's readers of kv and ps are done; qs is in\n"
        "        for (int e = threadIdx.x; e < 32 * D; e += 128) {\n"
        "            const int j = e / D, d = e %% D;\n"
        "            kv[j * KP + d] = j0 + j < S ? ld(k, kat(bkv, j0 + j) + d) : 0.f;\n"
        "        }\n"
        "        __syncthreads();\n"
        "        float s[RPW];\n"
        "#pragma unroll\n"
        "        for (int g = 0; g < RPW; g++) s[g] = 0.f;\n"
        "%s"
        "        const int j = j0 + lane;\n"
        "#pragma unroll\n"
        "        for (int g = 0; g < RPW; g++) {\n"
        "            const int i = i0 + warp + 4 * g;\n"
        "            const bool vis = j < S && (!CAUSAL || j <= i);\n"
        "            const float x = vis ? s[g] * SCALE : __int_as_float(0xff800000u);\n"
        "            const float mx = fmaxf(m[g], fs_warp_max(x));\n"
        "            const float corr = m[g] == mx ? 1.0f : expf(m[g] - mx);\n"
        "            const float p = vis ? expf(x - mx) : 0.f;\n"
        "            l[g] = l[g] * corr + fs_warp_sum(p);\n"
        "            m[g] = mx;\n"
        "#pragma unroll\n"
        "            for (int cc = 0; cc < CPL; cc++) acc[g][cc] *= corr;\n"
        "            ps[(warp + 4 * g) * 32 + lane] = p;\n"
        "        }\n"
        "        __syncthreads();  // every score read K\n"
        "        for (int e = threadIdx.x; e < 32 * DV; e += 128) {\n"
        "            const int j = e / DV, cc = e %% DV;\n"
        "            kv[j * DV + cc] = j0 + j < S ? ld(v, vat(bkv, j0 + j) + cc) : 0.f;\n"
        "        }\n"
        "        __syncthreads();\n"
        "        for (int jj = 0; jj < 32; jj++) {\n"
        "            float vv[CPL];\n"
        "#pragma unroll\n"
        "            for (int cc = 0; cc < CPL; cc++) vv[cc] = lane + 32 * cc < DV ? kv[jj * DV + lane + 32 * cc] : 0.f;\n"
        "#pragma unroll\n"
        "            for (int g = 0; g < RPW; g++) {\n"
        "                const float p = ps[(warp + 4 * g) * 32 + jj];\n"
        "#pragma unroll\n"
        "                for (int cc = 0; cc < CPL; cc++) acc[g][cc] += p * vv[cc];\n"
        "            }\n"
        "        }\n"
        "    }\n"
        "#pragma unroll\n"
        "    for (int g = 0; g < RPW; g++) {\n"
        "        const int i = i0 + warp + 4 * g;\n"
        "        if (i >= T) continue;\n"
        "        const float inv = 1.0f / l[g];\n"
        "#pragma unroll\n"
        "        for (int cc = 0; cc < CPL; cc++)\n"
        "            if (lane + 32 * cc < DV) st(o, oat(bh, i) + lane + 32 * cc, acc[g][cc] * inv);\n"
        "        if (lane == 0) lse[bh * T + i] = m[g] + logf(l[g]);\n"
        "    }\n"
        "}\n",
        cu_tin(c, 0), cu_tin(c, qkv_in(&a, 1)), cu_tin(c, qkv_in(&a, 2)), cu_tout(c, 0), consts(c, &a), rpw, cpl,
        (long long)odd(a.D),
        (long long)nqt, (long long)kv_pitch(&a), score_loop(c, &a));
    CuDim grid;
    if (cu_grid1(c, a.BH * nqt, &grid)) return -1;
    return cu_launch(c, op, src, grid, (CuDim){FWD_THREADS, 1, 1}, 0,
                     (int[]){cu_in_id(c, 0), cu_in_id(c, qkv_in(&a, 1)), cu_in_id(c, qkv_in(&a, 2)), cu_out_id(c, 0),
                             cu_out_id(c, 1)},
                     5);
}

static int forward(CuCtx *c, const Att *a, const char *op)
{
    if (cu_outv(c, 1)->dtype != DT_F32) return cu_fail(c, "%s: lse must be f32", op);
    if (cu_flash_takes(c, a, 0)) return cu_flash_fwd(c, a);
    return fwd_kernel(c, a);
}

/* attention(q, k, v, causal) -> o, lse */
int cuda_attention(CuCtx *c)
{
    Att a;
    return att_shape(c, "attention", &a) || forward(c, &a, "attention") ? -1 : 0;
}

/* attention_qkv(qkv, nh, nkv, causal) -> o, lse */
int cuda_attention_qkv(CuCtx *c)
{
    Att a;
    return packed_geometry(c, "attention_qkv", &a, 0) || forward(c, &a, "attention_qkv") ? -1 : 0;
}

/* attention_decode(q, k, v, kcache, vcache, pos) -> o: k's and v's rows into the caches
 * at row pos[0] (one thread per element; a position outside the cache traps), then
 * codegen/kernels/decode.cuh's flash-decoding over the caches, a block of DECODE_WARPS
 * warps per query row. */
int cuda_attention_decode(CuCtx *c)
{
    Att a;
    if (att_geometry(c, "attention_decode", &a, 3, 4)) return -1;
    if (cu_inv(c, 5)->dtype != DT_I32) return cu_fail(c, "attention_decode: an i32 pos only");
    int64_t bkv = a.BH / a.G, nk = bkv * a.T * a.D, nv = bkv * a.T * a.Dv;
    const char *src = cu_fmt(c,
        "extern \"C\" __global__ void KNAME(const %s *__restrict__ k, const %s *__restrict__ v, %s *__restrict__ kc, "
        "%s *__restrict__ vc, const int *__restrict__ pos)\n"
        "{\n"
        "    const long long e = (long long)blockIdx.x * 256 + threadIdx.x;\n"
        "    const long long T = %lldLL, S = %lldLL, D = %lldLL, DV = %lldLL, NK = %lldLL, NV = %lldLL;\n"
        "    const long long at = pos[0];\n"
        "    if (at < 0 || at + T > S) __trap();\n"
        "    if (e < NK) kc[(e / (T * D) * S + at) * D + e %% (T * D)] = k[e];\n"
        "    if (e < NV) vc[(e / (T * DV) * S + at) * DV + e %% (T * DV)] = v[e];\n"
        "}\n",
        cu_tin(c, 1), cu_tin(c, 2), cu_tin(c, 3), cu_tin(c, 4), (long long)a.T, (long long)a.S, (long long)a.D,
        (long long)a.Dv, (long long)nk, (long long)nv);
    CuDim grid;
    if (cu_grid1(c, cu_cdiv(nk > nv ? nk : nv, 256), &grid) ||
        cu_launch(c, "kv_write", src, grid, (CuDim){256, 1, 1}, 0,
                  (int[]){cu_in_id(c, 1), cu_in_id(c, 2), cu_in_id(c, 3), cu_in_id(c, 4), cu_in_id(c, 5)}, 5))
        return -1;
    cu_use(c, "decode.cuh");
    const char *params = cu_fmt(c, "%s, %s, %s, const int *__restrict__ pos, %s", cu_pin(c, 0, "q"), cu_pin(c, 3, "kc"),
                                cu_pin(c, 4, "vc"), cu_pout(c, 0, "o"));
    const char *attend = cu_kernel(c, 32 * DECODE_WARPS, params,
                                cu_fmt(c, "fs_attn_decode<%lld, %lld, %lld, %lld, %lld, %d>(q, kc, vc, pos, o, %s)",
                                       (long long)a.T, (long long)a.S, (long long)a.D, (long long)a.Dv, (long long)a.G,
                                       DECODE_WARPS, cu_float(c, a.scale)));
    if (cu_grid1(c, a.BH * a.T, &grid)) return -1;
    return cu_launch(c, "attention_decode", attend, grid, (CuDim){32 * DECODE_WARPS, 1, 1}, 0,
                     (int[]){cu_in_id(c, 0), cu_in_id(c, 3), cu_in_id(c, 4), cu_in_id(c, 5), cu_out_id(c, 0)}, 5);
}

/* ---- backward ------------------------------------------------------------------------ */

static int64_t bwd_smem(const Att *a, int tb)
{
    return 4 * (tb * (2 * odd(a->D) + 2 * odd(a->Dv)) + 2 * tb * tb + 2 * tb);
}

/* Shared tiles, the geometry, and the loaders both backward kernels use:
 *   load_q(i0): qs, dos (pitches QP, OP), ls = lse and dr = rowsum(dO * O) of query
 *     tile i0, zero past T; ends synchronized.
 *   load_kv(j0): ks, vs (pitches KP, VP) of key tile j0, zero past S.
 *   scores(i0, j0): dss = dS (and, for dK and dV, ps = P) of the tile pair, TB x TB,
 *     row = query. */
static char *bwd_common(CuCtx *c, const Att *a, int tb, int dkdv)
{
    return cu_fmt(c,
        "%s"
        "    constexpr int TB = %d, QP = %lld, KP = QP, OP = %lld, VP = OP;\n"
        "%s"
        "    __shared__ float qs[TB * QP], dos[TB * OP], ks[TB * KP], vs[TB * VP];\n"
        "    __shared__ float %sdss[TB * TB], ls[TB], dr[TB];\n"
        "    const int lane = threadIdx.x %% 32, warp = threadIdx.x / 32;\n"
        "    auto load_q = [&](long long bh, int i0) {\n"
        "        for (int e = threadIdx.x; e < TB * D; e += 256) {\n"
        "            const int r = e / D, d = e %% D;\n"
        "            qs[r * QP + d] = i0 + r < T ? ld(q, qat(bh, i0 + r) + d) : 0.f;\n"
        "        }\n"
        "        for (int e = threadIdx.x; e < TB * DV; e += 256) {\n"
        "            const int r = e / DV, cc = e %% DV;\n"
        "            dos[r * OP + cc] = i0 + r < T ? ld(dout, oat(bh, i0 + r) + cc) : 0.f;\n"
        "        }\n"
        "        if (threadIdx.x < TB) ls[threadIdx.x] = i0 + (int)threadIdx.x < T ? lse[bh * T + i0 + threadIdx.x] : 0.f;\n"
        "        __syncthreads();\n"
        "        for (int r = warp; r < TB; r += 8) {\n"
        "            float x = 0.f;\n"
        "            if (i0 + r < T)\n"
        "                for (int cc = lane; cc < DV; cc += 32) x += dos[r * OP + cc] * ld(o, oat(bh, i0 + r) + cc);\n"
        "            x = fs_warp_sum(x);\n"
        "            if (lane == 0) dr[r] = x;\n"
        "        }\n"
        "        __syncthreads();\n"
        "    };\n"
        "    auto load_kv = [&](long long bkv, int j0) {  // kv slice bkv\n"
        "        for (int e = threadIdx.x; e < TB * D; e += 256) {\n"
        "            const int j = e / D, d = e %% D;\n"
        "            ks[j * KP + d] = j0 + j < S ? ld(k, kat(bkv, j0 + j) + d) : 0.f;\n"
        "        }\n"
        "        for (int e = threadIdx.x; e < TB * DV; e += 256) {\n"
        "            const int j = e / DV, cc = e %% DV;\n"
        "            vs[j * VP + cc] = j0 + j < S ? ld(v, vat(bkv, j0 + j) + cc) : 0.f;\n"
        "        }\n"
        "    };\n"
        "    auto scores = [&](int i0, int j0) {\n"
        "        for (int e = threadIdx.x; e < TB * TB; e += 256) {\n"
        "            const int r = e / TB, j = e %% TB, i = i0 + r, jj = j0 + j;\n"
        "            float s = 0.f, dp = 0.f;\n"
        "            for (int d = 0; d < D; d++) s += qs[r * QP + d] * ks[j * KP + d];\n"
        "            for (int cc = 0; cc < DV; cc++) dp += dos[r * OP + cc] * vs[j * VP + cc];\n"
        "            const bool vis = i < T && jj < S && (!CAUSAL || jj <= i);\n"
        "            const float p = vis ? expf(s * SCALE - ls[r]) : 0.f;\n"
        "%s"
        "            dss[e] = vis ? p * (dp - dr[r]) : 0.f;\n"
        "        }\n"
        "    };\n",
        cu_fmt(c, "%s%s", consts(c, a),
               a->packed ? cu_fmt(c, "    auto *const dq = dqkv, *const dk = dqkv + %lldLL, "
                                     "*const dv = dqkv + %lldLL;\n"
                                  "    (void)dq, (void)dk, (void)dv;  // each kernel writes some\n",
                                  (long long)a->koff, (long long)a->voff)
                         : ""),
        tb, (long long)odd(a->D), (long long)odd(a->Dv),
        dkdv ? "    constexpr int NKT = (S + TB - 1) / TB, UK = (TB * D + 255) / 256, UV = (TB * DV + 255) / 256;\n"
             : "    constexpr int NQT = (T + TB - 1) / TB, UK = (TB * D + 255) / 256;\n",
        dkdv ? "ps[TB * TB], " : "", dkdv ? "            ps[e] = p;\n" : "");
}

/* Kernel 1: dK and dV of one key tile of one kv slice, over the query tiles that see it
 * in each of the slice's G query slices. */
static int emit_dkdv(CuCtx *c, const Att *a, int tb, const char *sig, const int *args, int n_args)
{
    const char *src = cu_fmt(c,
        "%s"
        "{\n"
        "%s"
        "    const long long bkv = blockIdx.x / NKT;\n"
        "    const int j0 = (int)(blockIdx.x %% NKT) * TB;\n"
        "    float ak[UK], av[UV];\n"
        "#pragma unroll\n"
        "    for (int u = 0; u < UK; u++) ak[u] = 0.f;\n"
        "#pragma unroll\n"
        "    for (int u = 0; u < UV; u++) av[u] = 0.f;\n"
        "    load_kv(bkv, j0);\n"
        "    for (long long bh = bkv * G; bh < (bkv + 1) * G; bh++)\n"
        "    for (int i0 = CAUSAL ? j0 : 0; i0 < T; i0 += TB) {\n"
        "        __syncthreads();  // the last tile's readers of qs, dos, ps, dss are done\n"
        "        load_q(bh, i0);\n"
        "        scores(i0, j0);\n"
        "        __syncthreads();\n"
        "#pragma unroll\n"
        "        for (int u = 0; u < UK; u++) {\n"
        "            const int e = threadIdx.x + 256 * u, j = e / D, d = e %% D;\n"
        "            float x = 0.f;\n"
        "            if (e < TB * D)\n"
        "                for (int r = 0; r < TB; r++) x += dss[r * TB + j] * qs[r * QP + d];\n"
        "            ak[u] += x;\n"
        "        }\n"
        "#pragma unroll\n"
        "        for (int u = 0; u < UV; u++) {\n"
        "            const int e = threadIdx.x + 256 * u, j = e / DV, cc = e %% DV;\n"
        "            float x = 0.f;\n"
        "            if (e < TB * DV)\n"
        "                for (int r = 0; r < TB; r++) x += ps[r * TB + j] * dos[r * OP + cc];\n"
        "            av[u] += x;\n"
        "        }\n"
        "    }\n"
        "#pragma unroll\n"
        "    for (int u = 0; u < UK; u++) {\n"
        "        const int e = threadIdx.x + 256 * u, j = e / D, d = e %% D;\n"
        "        if (e < TB * D && j0 + j < S) st(dk, kat(bkv, j0 + j) + d, ak[u] * SCALE);\n"
        "    }\n"
        "#pragma unroll\n"
        "    for (int u = 0; u < UV; u++) {\n"
        "        const int e = threadIdx.x + 256 * u, j = e / DV, cc = e %% DV;\n"
        "        if (e < TB * DV && j0 + j < S) st(dv, vat(bkv, j0 + j) + cc, av[u]);\n"
        "    }\n"
        "}\n",
        sig, bwd_common(c, a, tb, 1));
    CuDim grid;
    if (cu_grid1(c, a->BH / a->G * cu_cdiv(a->S, tb), &grid)) return -1;
    return cu_launch(c, "attention_bwd", src, grid, (CuDim){BWD_THREADS, 1, 1}, 0, args, n_args);
}

/* Kernel 2: dQ of one query tile, over the key tiles it sees; longest first. */
static int emit_dq(CuCtx *c, const Att *a, int tb, const char *sig, const int *args, int n_args)
{
    const char *src = cu_fmt(c,
        "%s"
        "{\n"
        "%s"
        "    const long long bh = blockIdx.x / NQT;\n"
        "    const int i0 = (NQT - 1 - (int)(blockIdx.x %% NQT)) * TB;\n"
        "    float aq[UK];\n"
        "#pragma unroll\n"
        "    for (int u = 0; u < UK; u++) aq[u] = 0.f;\n"
        "    load_q(bh, i0);\n"
        "    const int jend = CAUSAL ? min(S, i0 + TB) : S;\n"
        "    for (int j0 = 0; j0 < jend; j0 += TB) {\n"
        "        __syncthreads();  // the last tile's readers of ks, vs, dss are done\n"
        "        load_kv(bh / G, j0);\n"
        "        __syncthreads();\n"
        "        scores(i0, j0);\n"
        "        __syncthreads();\n"
        "#pragma unroll\n"
        "        for (int u = 0; u < UK; u++) {\n"
        "            const int e = threadIdx.x + 256 * u, r = e / D, d = e %% D;\n"
        "            float x = 0.f;\n"
        "            if (e < TB * D)\n"
        "                for (int j = 0; j < TB; j++) x += dss[r * TB + j] * ks[j * KP + d];\n"
        "            aq[u] += x;\n"
        "        }\n"
        "    }\n"
        "#pragma unroll\n"
        "    for (int u = 0; u < UK; u++) {\n"
        "        const int e = threadIdx.x + 256 * u, r = e / D, d = e %% D;\n"
        "        if (e < TB * D && i0 + r < T) st(dq, qat(bh, i0 + r) + d, aq[u] * SCALE);\n"
        "    }\n"
        "}\n",
        sig, bwd_common(c, a, tb, 0));
    CuDim grid;
    if (cu_grid1(c, a->BH * cu_cdiv(a->T, tb), &grid)) return -1;
    return cu_launch(c, "attention_bwd", src, grid, (CuDim){BWD_THREADS, 1, 1}, 0, args, n_args);
}

static int backward(CuCtx *c, const Att *a0)
{
    Att a = *a0;
    if (cu_inv(c, a.in_lse)->dtype != DT_F32) return cu_fail(c, "%s: lse must be f32", op_name(cu_node(c)->op));
    if (cu_flash_takes(c, &a, 1)) return cu_flash_bwd(c, &a);
    int tb = 32;
    while (tb > 4 && (bwd_smem(&a, tb) > SMEM_MAX || tb * (a.D + a.Dv) > 64 * BWD_THREADS)) tb /= 2;
    if (bwd_smem(&a, tb) > SMEM_MAX)
        return cu_fail(c, "attention_bwd: head dims D = %lld, Dv = %lld need %lld bytes of shared memory per block, over the %d "
                          "the CUDA kernels use (D, Dv up to about 300 fit)",
                       (long long)a.D, (long long)a.Dv, (long long)bwd_smem(&a, tb), SMEM_MAX);
    // both kernels take every tensor, so that their text shares one signature (attention_qkv: q, k and v are one
    // tensor, which the kernels read from three columns, and dq, dk, dv the columns of one output, dqkv)
    int q = 0, k = qkv_in(&a, 1), v = qkv_in(&a, 2), n = a.packed ? 7 : 9;
    const char *outs = a.packed ? cu_fmt(c, "%s *__restrict__ dqkv", cu_tout(c, 0))
                                : cu_fmt(c, "%s *__restrict__ dq, %s *__restrict__ dk, %s *__restrict__ dv",
                                         cu_tout(c, 0), cu_tout(c, 1), cu_tout(c, 2));
    const char *sig = cu_fmt(c,
        "extern \"C\" __global__ void __launch_bounds__(256) KNAME(const %s *__restrict__ q, const %s *__restrict__ k, "
        "const %s *__restrict__ v, const %s *__restrict__ o, const float *__restrict__ lse, const %s *__restrict__ dout, "
        "%s)\n",
        cu_tin(c, q), cu_tin(c, k), cu_tin(c, v), cu_tin(c, a.in_o), cu_tin(c, a.in_dout), outs);
    int args[9] = {cu_in_id(c, q), cu_in_id(c, k), cu_in_id(c, v), cu_in_id(c, a.in_o), cu_in_id(c, a.in_lse),
                   cu_in_id(c, a.in_dout), cu_out_id(c, 0)};
    if (!a.packed) args[7] = cu_out_id(c, 1), args[8] = cu_out_id(c, 2);
    if (emit_dkdv(c, &a, tb, sig, args, n)) return -1;
    return emit_dq(c, &a, tb, sig, args, n);
}

/* attention_bwd(q, k, v, o, lse, dout, causal) -> dq, dk, dv */
int cuda_attention_bwd(CuCtx *c)
{
    Att a;
    return att_shape(c, "attention_bwd", &a) || backward(c, &a) ? -1 : 0;
}

/* attention_qkv_bwd(qkv, o, lse, dout, nh, nkv, causal) -> dqkv */
int cuda_attention_qkv_bwd(CuCtx *c)
{
    Att a;
    return packed_geometry(c, "attention_qkv_bwd", &a, 1) || backward(c, &a) ? -1 : 0;
}
