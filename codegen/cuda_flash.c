/* codegen/cuda_flash.c: CUDA launches of attention and attention_bwd on tensor cores, the
 * templates of codegen/kernels/flash.cuh (forward) and flash_bwd.cuh (backward), whose
 * comments give the algorithm (FlashAttention-2: mma.sync m16n8k16, ldmatrix, cp.async
 * double-buffering; the backward without atomics, bitwise reproducible).
 *
 * Taken here: attention and attention_qkv (the heads read as column ranges of the QKV
 * projection's rows: the CuAtt's layouts become flash.cuh's FsAttLay), their q, k, v (and
 * o, dout, dq, dk, dv) all bf16 or all f16, or all f32 in a plan compiled with the tf32
 * setting (the same kernels with E = float on mma m16n8k8 tf32), head dims D = Dv a
 * multiple of 8 up to 128, any T and S (tails masked), causal or not, grouped-query
 * attention, every buffer 16-byte aligned (memplan gives 64; a view might not). Anything
 * else, fp32 plans without tf32 included, runs on the f32 kernels
 * (codegen/kernels/attention_f32.cuh). attention_masked (_qkv_masked) takes the same kernels
 * with its key mask (template arguments MPER, MT: i32 or f32, whatever q's dtype), in 16 bits and
 * under tf32 alike (tests/py/attn_mask.py --emu-shapes, --emu-tf32). attention_decode,
 * planned in fp32, has its own kernel (codegen/kernels/decode.cuh).
 *
 * Launches: forward, one of 128 threads per 64 query rows; backward, Dr = rowsum(dO o)
 * into dq's bytes, then dK/dV over key tiles of 64, then dQ over query tiles of 64.
 * Dynamic shared memory above 48 KiB is allowed by the runtime (runtime/cuda/backend.c);
 * f32 tiles take twice the 16-bit ones' bytes (head dim 128: 165 KiB forward, under the
 * 227 KiB an sm_90 block may have).
 *
 * Where it sits: called by cuda_attention.c's emitters, for the node being emitted.
 */
#include "cuda_rows.h"

enum { FL_THREADS = 128, FL_TILE = 64, FL_MAX_D = 128, FL_DKDV_ROWS = 32 };

/* The bytes of one element of the node's q (2, or 4 under tf32). */
static int64_t esize(const CuCtx *c) { return cu_inv(c, 0)->dtype == DT_F32 ? 4 : 2; }

/* The row pitch of the shared tiles, elements (flash.cuh's FsFlashDim<D, E>::P): one 16-byte chunk past D
 * rounded up to 16. */
static int64_t pitch(const CuCtx *c, int64_t D)
{
    return (D + 15) / 16 * 16 + 16 / esize(c);
}

char *cu_att_lay(CuCtx *c, const CuLay *q, const CuLay *k, const CuLay *v, const CuLay *o)
{
    return cu_fmt(c,
                  "FsAttLay<%lld, %lldLL, %lldLL, %lldLL, %lld, %lldLL, %lldLL, %lldLL, %lldLL, %lldLL, %lldLL, "
                  "%lldLL, %lldLL, %lldLL>",
                  (long long)q->nh, (long long)q->b, (long long)q->h, (long long)q->r, (long long)k->nh,
                  (long long)k->b, (long long)k->h, (long long)k->r, (long long)v->b, (long long)v->h, (long long)v->r,
                  (long long)o->b, (long long)o->h, (long long)o->r);
}

static int aligned16(const Value *v)
{
    return v->offset % 16 == 0 && v->rank_stride % 16 == 0;
}

int cu_flash_takes(const CuCtx *c, const CuAtt *a, int bwd)
{
    DType t = cu_inv(c, 0)->dtype;
    if (t != DT_BF16 && t != DT_F16 && !(t == DT_F32 && c->tf32)) return 0;
    if (a->D != a->Dv || a->D % 8 || a->D > FL_MAX_D) return 0;
    const Node *n = cu_node(c);
    for (int i = 0; i < n->n_in; i++) {
        const Value *v = cu_inv(c, i);
        if ((bwd && i == a->in_lse) || (a->mper && i == a->in_mask)) continue;  // lse: f32; the mask: any
        if (v->dtype != t || !aligned16(v)) return 0;
    }
    for (int i = 0; i < n->n_out; i++) {
        const Value *v = cu_outv(c, i);
        if (!bwd && i == 1) continue;  // lse: f32, written as floats
        if (v->dtype != t || !aligned16(v)) return 0;
    }
    return 1;
}

/* The template arguments every kernel starts with: E, TQ, SK, D, G, CAUSAL, the layouts (k's serve v). */
static char *targs(CuCtx *c, const CuAtt *a)
{
    const CuLay *q = &a->lq, *k = &a->lk, *o = &a->lo;  // v's is k's (D = Dv)
    return cu_fmt(c, "%s, %lld, %lld, %lld, %lld, %s, %s", cu_tin(c, 0), (long long)a->T, (long long)a->S,
                  (long long)a->D, (long long)a->G, a->causal ? "true" : "false", cu_att_lay(c, q, k, k, o));
}

/* The mask's tensor id (attention_masked), or -1. */
static int mask_id(CuCtx *c, const CuAtt *a) { return a->mper ? cu_in_id(c, a->in_mask) : -1; }

static int launch(CuCtx *c, const char *prefix, const char *src, int64_t blocks, int64_t smem, const int *args, int n)
{
    CuDim grid;
    if (cu_grid1(c, blocks, &grid)) return -1;
    return cu_launch(c, prefix, src, grid, (CuDim){FL_THREADS, 1, 1}, (int)smem, args, n);
}

int cu_flash_fwd(CuCtx *c, const CuAtt *a)
{
    cu_use(c, "flash.cuh");
    const char *params = cu_fmt(c, "%s, %s, %s%s", cu_att_params(c, a), cu_pout(c, 0, "o"), cu_pout(c, 1, "lse"),
                                cu_att_mask_param(c, a));
    const char *src = cu_kernel(c, FL_THREADS, params,
                                cu_fmt(c, "fs_flash_fwd<%s, %lldLL%s>(%s, o, lse, %s%s)", targs(c, a), (long long)a->BH,
                                       cu_att_mask_targ(c, a), cu_att_args(c, a), cu_float(c, a->scale),
                                       a->mper ? ", mask" : ""));
    int64_t smem = esize(c) * 5 * FL_TILE * pitch(c, a->D);  // q, then two buffers of k and v
    int ids[6], n = cu_att_ids(c, a, ids, (int[]){cu_out_id(c, 0), cu_out_id(c, 1), mask_id(c, a)}, a->mper ? 3 : 2);
    return launch(c, "attention_tc", src, a->BH * cu_cdiv(a->T, FL_TILE), smem, ids, n);
}

/* Kernel 1 of the backward: LPR lanes per row, the largest power of two up to 16 that
 * divides the row's 16-byte chunks (D / 8, f32: D / 4). */
static int emit_dsum(CuCtx *c, const CuAtt *a)
{
    int64_t lpr = 16;
    while ((a->D * esize(c) / 16) % lpr) lpr /= 2;
    int64_t rows = a->BH * a->T;
    const char *params =
        cu_fmt(c, "%s, %s, %s", cu_pin(c, a->in_o, "o"), cu_pin(c, a->in_dout, "dout"), cu_pout(c, 0, "dq"));
    const char *lay = cu_att_lay(c, &a->lq, &a->lk, &a->lv, &a->lo);
    const char *src = cu_kernel(c, FL_THREADS, params,
                                cu_fmt(c, "fs_flash_dsum<%s, %lld, %lld, %lld, %s, %lldLL>(o, dout, dq)", cu_tin(c, 0),
                                       (long long)a->T, (long long)a->D, (long long)lpr, lay, (long long)rows));
    return launch(c, "attention_bwd", src, cu_cdiv(rows * lpr, FL_THREADS), 0,
                  (int[]){cu_in_id(c, a->in_o), cu_in_id(c, a->in_dout), cu_out_id(c, 0)}, 3);
}

int cu_flash_bwd(CuCtx *c, const CuAtt *a)
{
    cu_use(c, "flash_bwd.cuh");
    if (emit_dsum(c, a)) return -1;
    const char *E = cu_tin(c, 0);
    // the inner tiles (flash_bwd.cuh): dK/dV's query rows a step, dQ's keys a step (tf32: 32, its scalar fragment
    // loads need the registers: at 64 keys and head dim 64 ptxas spilled)
    int64_t bkv = a->BH / a->G, P = pitch(c, a->D), es = esize(c), bm = FL_DKDV_ROWS;
    int64_t bn = a->D <= 64 && es == 2 ? 64 : 32;
    const char *ins = cu_fmt(c, "%s, const float *__restrict__ lse, %s%s", cu_att_params(c, a),
                             cu_pin(c, a->in_dout, "dout"), cu_att_mask_param(c, a));
    const char *mt = cu_att_mask_targ(c, a), *marg = a->mper ? ", mask" : "";
    int extra[6] = {cu_in_id(c, a->in_lse), cu_in_id(c, a->in_dout), mask_id(c, a)}, ids[9], n;
    int ne = a->mper ? 3 : 2;  // the ids of lse, dout (and the mask), then the outputs'
    const char *douts = "dk, dv", *dkdv_params;  // attention_qkv: dk and dv are dq's columns
    if (a->packed) {
        douts = cu_fmt(c, "dq + %lld, dq + %lld", (long long)a->koff, (long long)a->voff);
        dkdv_params = cu_fmt(c, "%s, %s", ins, cu_pout(c, 0, "dq"));
        extra[ne] = cu_out_id(c, 0);
        n = cu_att_ids(c, a, ids, extra, ne + 1);
    } else {
        dkdv_params =
            cu_fmt(c, "%s, const %s *__restrict__ dq, %s, %s", ins, E, cu_pout(c, 1, "dk"), cu_pout(c, 2, "dv"));
        extra[ne] = cu_out_id(c, 0), extra[ne + 1] = cu_out_id(c, 1), extra[ne + 2] = cu_out_id(c, 2);
        n = cu_att_ids(c, a, ids, extra, ne + 3);
    }
    const char *dkdv = cu_kernel(c, FL_THREADS, dkdv_params,
                                 cu_fmt(c, "fs_flash_dkdv<%s, %lld, %lldLL%s>(%s, lse, dout, dq, %s, %s%s)",
                                        targs(c, a), (long long)bm, (long long)bkv, mt, cu_att_args(c, a), douts,
                                        cu_float(c, a->scale), marg));
    int64_t smem = es * (2 * FL_TILE + 4 * bm) * P + 4 * 4 * bm;  // k, v, two of q and dO; two of lse and Dr
    if (launch(c, "attention_bwd_tc", dkdv, bkv * cu_cdiv(a->S, FL_TILE), smem, ids, n)) return -1;
    const char *dq = cu_kernel(c, FL_THREADS, cu_fmt(c, "%s, %s", ins, cu_pout(c, 0, "dq")),
                               cu_fmt(c, "fs_flash_dq<%s, %lld, %lldLL%s>(%s, lse, dout, dq, %s%s)", targs(c, a),
                                      (long long)bn, (long long)a->BH, mt, cu_att_args(c, a), cu_float(c, a->scale),
                                      marg));
    smem = es * (2 * FL_TILE + 4 * bn) * P;  // q, dO, two of k and v
    extra[ne] = cu_out_id(c, 0);
    n = cu_att_ids(c, a, ids, extra, ne + 1);
    return launch(c, "attention_bwd_tc", dq, a->BH * cu_cdiv(a->T, FL_TILE), smem, ids, n);
}
