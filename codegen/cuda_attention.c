/* codegen/cuda_attention.c: CUDA emitters of attention, attention_bwd, attention_rows and
 * attention_decode (the KV cache's write, then codegen/kernels/decode.cuh's kernel over
 * the caches with query row i at position pos + i; see the op's rule in ops/shape.c).
 * 16-bit attention (fp32 too under the tf32 setting) and its backward with head dims D = Dv
 * a multiple of 8 up to 128 run on tensor cores (codegen/cuda_flash.c, which says exactly
 * what it takes); the rest (fp32 plans without tf32, other head dims) runs on codegen/kernels/attention_f32.cuh's
 * templates, launched here: flash attention in f32 on CUDA cores, never a T x S matrix
 * in memory. Semantics are
 * runtime/cpu/attention.c's:
 *   attention(q [BH, T, D], k [BKV, S, D], v [BKV, S, Dv], causal) -> o [BH, T, Dv] and
 *   lse [BH, T] (f32), the log-sum-exp of each row of scores s = q.k / sqrt(D); under
 *   causal (T == S) query i sees keys j <= i. Grouped-query attention: G = BH / BKV
 *   query slices in a row share kv slice bh / G.
 * attention_masked(q, k, v, mask, causal) and its backward: attention's kernels (tensor cores
 *   or f32, as for attention) with a key mask [B, S], slice bh reading row bh / (BH / B): i32,
 *   boolean (masked keys score -inf), or float, additive (added to the scaled scores; -inf
 *   masks); a row that sees no key gives o = 0 and lse = -inf, and no gradient (the CPU
 *   kernel's rule).
 * attention_qkv(qkv, nh, nkv, causal) and its backward (and attention_qkv_masked's, with the
 * mask input 1) run the same kernels with the heads
 * read as column ranges of the QKV projection's rows (CuAtt's layouts; passes/packed_attn.c):
 * every address is a layout's (FsAttLay, codegen/kernels/attn_layout.cuh), and q, k, v (dq,
 * dk, dv) are one tensor at three column offsets. attention_rows(q, k, v, nh, nkv, causal) and its
 * backward are the same with q, k, v (dq, dk, dv) three tensors, Llama's projections' outputs as they
 * lie: [..., T, nh D] and [..., T, nkv D], each head a column range of its rows.
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
 * (query tile, key tile) pair, a thread's elements sharing one key (loaded once for all of
 * them), and accumulate with a thread's elements sharing one column where the width
 * divides the block; under grouped-query attention
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

/* attention_rows' (and its backward's) geometry: q [..., T, nh D], k and v [..., T, nkv D] are inputs 0, 1, 2, each
 * head a column range of its rows; bwd: o, lse, dout are inputs 3, 4, 5, and dq, dk, dv outputs 0, 1, 2. */
static int rows_geometry(CuCtx *c, const char *op, Att *a, int bwd)
{
    const Value *q = cu_inv(c, 0), *k = cu_inv(c, 1), *v = cu_inv(c, 2);
    int64_t nh = ir_attr_int(c->g, cu_node(c), "nh", 1), nkv = ir_attr_int(c->g, cu_node(c), "nkv", 1);
    int64_t T = q->shape[q->rank - 2], W = q->shape[q->rank - 1], D = W / nh;
    if (!dtype_is_float(q->dtype) || !dtype_is_float(k->dtype) || !dtype_is_float(v->dtype) || nh < 1 || nkv < 1 ||
        nh % nkv || W % nh || ir_numel(k) * nh != ir_numel(q) * nkv || ir_numel(v) != ir_numel(k))
        return cu_fail(c, "%s: float q of nh heads, k and v of nkv heads, over the same rows only", op);
    if (T > (1 << 30)) return cu_fail(c, "%s: sequences longer than 2^30", op);
    *a = (Att){.BH = ir_numel(q) / W / T * nh, .G = nh / nkv, .T = T, .S = T, .D = D, .Dv = D,
               .causal = ir_attr_int(c->g, cu_node(c), "causal", 0) != 0, .scale = 1.0f / sqrtf((float)D)};
    a->lq = a->lo = (CuLay){nh, T * W, D, W}, a->lk = a->lv = (CuLay){nkv, T * nkv * D, D, nkv * D};
    a->in_o = bwd ? 3 : -1, a->in_lse = bwd ? 4 : -1, a->in_dout = bwd ? 5 : -1;
    return 0;
}

/* The node input that holds q (0), k (1) or v (2). */
static int qkv_in(const Att *a, int i) { return a->packed ? 0 : i; }

const char *cu_att_params(CuCtx *c, const CuAtt *a)
{
    if (a->packed) return cu_pin(c, 0, "qkv");
    return cu_fmt(c, "%s, %s, %s", cu_pin(c, 0, "q"), cu_pin(c, 1, "k"), cu_pin(c, 2, "v"));
}

const char *cu_att_args(CuCtx *c, const CuAtt *a)
{
    if (a->packed) return cu_fmt(c, "qkv, qkv + %lld, qkv + %lld", (long long)a->koff, (long long)a->voff);
    return "q, k, v";
}

int cu_att_ids(CuCtx *c, const CuAtt *a, int *ids, const int *extra, int n)
{
    int k = 0;
    for (int i = 0; i < (a->packed ? 1 : 3); i++) ids[k++] = cu_in_id(c, i);
    for (int i = 0; i < n; i++) ids[k++] = extra[i];
    return k;
}

static int att_shape(CuCtx *c, const char *op, Att *a)
{
    if (att_geometry(c, op, a, 1, 2)) return -1;
    if (a->causal && a->T != a->S) return cu_fail(c, "%s: causal needs T == S (%lld, %lld)", op, (long long)a->T, (long long)a->S);
    return 0;
}

static int64_t odd(int64_t n) { return n | 1; }

/* The forward's kv tile pitch: K rows at odd(D), V rows at Dv, in one buffer. */
static int64_t kv_pitch(const Att *a) { return odd(a->D) > a->Dv ? odd(a->D) : a->Dv; }

/* The template arguments both directions' kernels start with: the dtypes of q, k, v and o, then the geometry. */
static char *targs(CuCtx *c, const Att *a)
{
    return cu_fmt(c, "%s, %s, %s, %s, %lld, %lld, %lld, %lld, %lld, %s", cu_tin(c, 0), cu_tin(c, qkv_in(a, 1)),
                  cu_tin(c, qkv_in(a, 2)), a->in_o >= 0 ? cu_tin(c, a->in_o) : cu_tout(c, 0), (long long)a->T,
                  (long long)a->S, (long long)a->D, (long long)a->Dv, (long long)a->G, a->causal ? "true" : "false");
}

const char *cu_att_mask_targ(CuCtx *c, const CuAtt *a)
{
    return a->mper ? cu_fmt(c, ", %lld", (long long)a->mper) : "";
}

const char *cu_att_mask_param(CuCtx *c, const CuAtt *a)
{
    return a->mper ? cu_fmt(c, ", %s", cu_pin(c, a->in_mask, "mask")) : "";
}

/* ---- forward ------------------------------------------------------------------------ */

static int64_t fwd_smem(const Att *a, int rpw)
{
    int64_t bq = 4 * rpw;
    return 4 * (bq * a->D + KEYS * kv_pitch(a) + bq * KEYS);
}

/* The forward kernel (attention_f32.cuh's fs_attf_fwd): attention's (q, k, v) -> (o, lse). */
static int fwd_kernel(CuCtx *c, const Att *a)
{
    const char *op = op_name(cu_node(c)->op);
    int rpw = 8, cpl = (int)cu_cdiv(a->Dv, 32);
    while (rpw > 1 && (fwd_smem(a, rpw) > SMEM_MAX || rpw * cpl > 64)) rpw /= 2;
    if (fwd_smem(a, rpw) > SMEM_MAX || rpw * cpl > 64)
        return cu_fail(c, "%s: head dims D = %lld, Dv = %lld need %lld bytes of shared memory per block, over the %d the "
                          "CUDA kernels use (D, Dv up to about 300 fit)",
                       op, (long long)a->D, (long long)a->Dv, (long long)fwd_smem(a, rpw), SMEM_MAX);
    cu_use(c, "attention_f32.cuh");
    const char *params = cu_fmt(c, "%s, %s, %s%s", cu_att_params(c, a), cu_pout(c, 0, "o"), cu_pout(c, 1, "lse"),
                                cu_att_mask_param(c, a));
    const char *src = cu_kernel(c, FWD_THREADS, params,
                                cu_fmt(c, "fs_attf_fwd<%s, %d, %s%s>(%s, o, lse, %s%s)", targs(c, a), rpw,
                                       cu_att_lay(c, &a->lq, &a->lk, &a->lv, &a->lo), cu_att_mask_targ(c, a),
                                       cu_att_args(c, a), cu_float(c, a->scale), a->mper ? ", mask" : ""));
    CuDim grid;
    if (cu_grid1(c, a->BH * cu_cdiv(a->T, 4 * rpw), &grid)) return -1;
    int mask = a->mper ? cu_in_id(c, a->in_mask) : -1;
    int ids[6], n = cu_att_ids(c, a, ids, (int[]){cu_out_id(c, 0), cu_out_id(c, 1), mask}, a->mper ? 3 : 2);
    return cu_launch(c, op, src, grid, (CuDim){FWD_THREADS, 1, 1}, 0, ids, n);
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
    Att a = {0};
    return att_shape(c, "attention", &a) || forward(c, &a, "attention") ? -1 : 0;
}

/* The [B, S] key mask (input i; i32: boolean, float: additive) of a's geometry, each row read by mper = BH / B
 * query slices. */
static int att_mask(CuCtx *c, const char *op, Att *a, int i)
{
    const Value *m = cu_inv(c, i);
    if ((m->dtype != DT_I32 && !dtype_is_float(m->dtype)) || m->rank != 2 || m->shape[1] != a->S ||
        m->shape[0] < 1 || a->BH % m->shape[0])
        return cu_fail(c, "%s: the mask must be i32 or float [B, S]", op);
    a->mper = a->BH / m->shape[0], a->in_mask = i;
    return 0;
}

/* attention_masked(q, k, v, mask, causal) -> o, lse: attention's geometry and the mask (input 3). */
static int masked_shape(CuCtx *c, const char *op, Att *a)
{
    return att_shape(c, op, a) || att_mask(c, op, a, 3) ? -1 : 0;
}

int cuda_attention_masked(CuCtx *c)
{
    Att a = {0};
    if (masked_shape(c, "attention_masked", &a)) return -1;
    a.in_o = a.in_lse = a.in_dout = -1;  // input 3 is the mask; o's dtype is the output's
    return forward(c, &a, "attention_masked");
}

/* attention_qkv(qkv, nh, nkv, causal) -> o, lse */
int cuda_attention_qkv(CuCtx *c)
{
    Att a = {0};
    return packed_geometry(c, "attention_qkv", &a, 0) || forward(c, &a, "attention_qkv") ? -1 : 0;
}

/* attention_qkv_masked(qkv, mask, nh, nkv, causal) -> o, lse: attention_qkv's geometry, the mask input 1 */
int cuda_attention_qkv_masked(CuCtx *c)
{
    Att a = {0};
    const char *op = "attention_qkv_masked";
    return packed_geometry(c, op, &a, 0) || att_mask(c, op, &a, 1) || forward(c, &a, op) ? -1 : 0;
}

/* attention_decode(q, k, v, kcache, vcache, pos) -> o: k's and v's rows into the caches
 * at row pos[0] (one thread per element; a position outside the cache traps), then
 * codegen/kernels/decode.cuh's flash-decoding over the caches, a block of DECODE_WARPS
 * warps per query row. */
int cuda_attention_decode(CuCtx *c)
{
    Att a = {0};
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

/* Kernel 1 (dK, dV over key tiles) or kernel 2 (dQ over query tiles) of attention_f32.cuh's backward. */
static int emit_bwd(CuCtx *c, const Att *a, int tb, int dkdv)
{
    const char *ins = cu_fmt(c, "%s, %s, const float *__restrict__ lse, %s", cu_att_params(c, a),
                             cu_pin(c, a->in_o, "o"), cu_pin(c, a->in_dout, "dout"));
    int extra[4] = {cu_in_id(c, a->in_o), cu_in_id(c, a->in_lse), cu_in_id(c, a->in_dout), cu_out_id(c, 0)}, ids[10];
    const char *outs, *args;  // attention_qkv: dq, dk and dv are columns of one output, dqkv
    if (a->packed) {
        outs = cu_pout(c, 0, "dqkv");
        args = dkdv ? cu_fmt(c, "dqkv + %lld, dqkv + %lld", (long long)a->koff, (long long)a->voff) : "dqkv";
    } else if (dkdv) {
        outs = cu_fmt(c, "%s, %s", cu_pout(c, 1, "dk"), cu_pout(c, 2, "dv")), args = "dk, dv";
        extra[3] = cu_out_id(c, 1);
    } else {
        outs = cu_pout(c, 0, "dq"), args = "dq";
    }
    int n = cu_att_ids(c, a, ids, extra, 4);
    if (dkdv && !a->packed) ids[n++] = cu_out_id(c, 2);
    if (a->mper) ids[n++] = cu_in_id(c, a->in_mask);
    const char *params = cu_fmt(c, "%s, %s%s", ins, outs, cu_att_mask_param(c, a));
    const char *src = cu_kernel(c, BWD_THREADS, params,
                                cu_fmt(c, "fs_attf_%s<%s, %d, %s%s>(%s, o, lse, dout, %s, %s%s)", dkdv ? "dkdv" : "dq",
                                       targs(c, a), tb, cu_att_lay(c, &a->lq, &a->lk, &a->lv, &a->lo),
                                       cu_att_mask_targ(c, a), cu_att_args(c, a), args, cu_float(c, a->scale),
                                       a->mper ? ", mask" : ""));
    CuDim grid;
    if (cu_grid1(c, dkdv ? a->BH / a->G * cu_cdiv(a->S, tb) : a->BH * cu_cdiv(a->T, tb), &grid)) return -1;
    return cu_launch(c, "attention_bwd", src, grid, (CuDim){BWD_THREADS, 1, 1}, 0, ids, n);
}

static int backward(CuCtx *c, const Att *a0)
{
    Att a = *a0;
    if (cu_inv(c, a.in_lse)->dtype != DT_F32) return cu_fail(c, "%s: lse must be f32", op_name(cu_node(c)->op));
    if (cu_flash_takes(c, &a, 1)) return cu_flash_bwd(c, &a);
    int tb = 32;
    while (tb > 4 && (bwd_smem(&a, tb) > SMEM_MAX || tb * (a.D + a.Dv) > 64 * BWD_THREADS)) tb /= 2;
    if (bwd_smem(&a, tb) > SMEM_MAX)
        return cu_fail(c, "%s: head dims D = %lld, Dv = %lld need %lld bytes of shared memory per block, over the %d the "
                          "CUDA kernels use (D, Dv up to about 300 fit)",
                       op_name(cu_node(c)->op), (long long)a.D, (long long)a.Dv, (long long)bwd_smem(&a, tb), SMEM_MAX);
    return emit_bwd(c, &a, tb, 1) || emit_bwd(c, &a, tb, 0) ? -1 : 0;
}

/* attention_bwd(q, k, v, o, lse, dout, causal) -> dq, dk, dv */
int cuda_attention_bwd(CuCtx *c)
{
    Att a = {0};
    return att_shape(c, "attention_bwd", &a) || backward(c, &a) ? -1 : 0;
}

/* attention_qkv_bwd(qkv, o, lse, dout, nh, nkv, causal) -> dqkv */
int cuda_attention_qkv_bwd(CuCtx *c)
{
    Att a = {0};
    return packed_geometry(c, "attention_qkv_bwd", &a, 1) || backward(c, &a) ? -1 : 0;
}

/* attention_qkv_masked_bwd(qkv, mask, o, lse, dout, nh, nkv, causal) -> dqkv */
int cuda_attention_qkv_masked_bwd(CuCtx *c)
{
    Att a = {0};
    const char *op = "attention_qkv_masked_bwd";
    if (packed_geometry(c, op, &a, 1) || att_mask(c, op, &a, 1)) return -1;
    a.in_o = 2, a.in_lse = 3, a.in_dout = 4;
    return backward(c, &a);
}

/* attention_rows(q, k, v, nh, nkv, causal) -> o, lse */
int cuda_attention_rows(CuCtx *c)
{
    Att a = {0};
    return rows_geometry(c, "attention_rows", &a, 0) || forward(c, &a, "attention_rows") ? -1 : 0;
}

/* attention_rows_bwd(q, k, v, o, lse, dout, nh, nkv, causal) -> dq, dk, dv */
int cuda_attention_rows_bwd(CuCtx *c)
{
    Att a = {0};
    return rows_geometry(c, "attention_rows_bwd", &a, 1) || backward(c, &a) ? -1 : 0;
}

/* attention_masked_bwd(q, k, v, mask, o, lse, dout, causal) -> dq, dk, dv */
int cuda_attention_masked_bwd(CuCtx *c)
{
    Att a = {0};
    if (masked_shape(c, "attention_masked_bwd", &a)) return -1;
    a.in_o = 4, a.in_lse = 5, a.in_dout = 6;
    return backward(c, &a);
}
