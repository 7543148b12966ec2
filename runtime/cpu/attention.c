/* runtime/cpu/attention.c: scaled dot-product attention (forward and backward), its
 * decode step with a KV cache, and rotary position embedding (rope, rope_at, rope_rows).
 *
 * attention_decode(q [BH, T, D], k [BKV, T, D], v [BKV, T, Dv], kcache [BKV, S, D],
 * vcache [BKV, S, Dv], pos) writes k's and v's rows into the caches at rows pos.., then
 * runs the forward below over the caches, causal with an offset: query row i is at
 * position pos + i and sees the cache rows up to it (no lse). Its tiles are the
 * forward's, so a row's result is the full causal attention's up to rounding.
 *
 * attention(q [BH, T, D], k [BKV, S, D], v [BKV, S, Dv], causal) -> out [BH, T, Dv] and
 * lse [BH, T], the log-sum-exp of each row of scaled, masked scores. BH is a multiple
 * of BKV: under grouped-query attention G = BH / BKV query slices in a row share one
 * kv slice (query slice bh reads kv slice bh / G; k and v repeat_interleave'd). No T x S matrix is
 * ever stored: the forward is flash attention. A task owns a block of BQ query rows and
 * walks blocks of bk keys, with one score tile on the stack, cblas_sgemm for both
 * products, and an online softmax (running max m and sum l per row) that rescales the
 * output rows it accumulates in place.
 *
 * The backward recomputes each tile's probabilities from lse, P = exp(S - lse), then
 *   dP = dO V^T,  dS = P * (dP - rowsum(dO * O)),
 *   dV += P^T dO, dK += scale dS^T Q, dQ += scale dS K.
 * With many kv slices a task takes a whole kv slice with its G query slices and walks
 * their tiles in order; with few, one pass over (kv slice, key block) tasks accumulates
 * dK and dV and a second over (query slice, query block) tasks accumulates dQ,
 * recomputing the tiles. Each gradient block sums its tiles in the same order either
 * way (dK, dV over the group's query slices, then query blocks; dQ over key blocks;
 * ascending) with the same calls, so the result is bitwise the same whatever the thread
 * count.
 *
 * Tile GEMMs stay at or below OpenBLAS's single-thread size (m*n*k <= 2^18, for head
 * dims up to 512), so OpenBLAS never starts its own threads inside our parallel regions.
 *
 * attention_qkv(qkv [B, T, (NH + 2 NKV) D], nh, nkv, causal) and its backward are the same
 * kernels on the QKV projection's output as it lies (passes/packed_attn.c): every tensor is
 * addressed through a layout (Lay: slice s's row i at s / nh * b + s % nh * h + i * r, so a
 * head is a column range of the rows), o and dout are [B, T, NH D], and dq, dk, dv are the
 * column ranges of dqkv. The contiguous ops are the layout nh = 1, h = 0, r = the row width.
 * attention_rows(q [B, T, NH D], k, v [B, T, NKV D], nh, nkv, causal) is the same on Llama's three projections'
 * outputs (q, k, v and dq, dk, dv each a tensor of its own, heads as column ranges of its rows), and
 * rope_rows(x [B, T, n D], n) is rope on that layout: the n heads of a row each turned as rope turns a head.
 *
 * attention_masked(q, k, v, mask, causal) and its backward are attention's kernels with a key
 * mask [B, S] for q's B batch items (slices bh of item bh / (BH / B)). An i32 mask is boolean:
 * key j of item b takes part where mask[b, j] != 0. A float one is additive: mask[b, j] is
 * added to the key's scaled scores, and -inf masks the key. The causal rule still applies. A
 * query row that sees no key (every key masked) gets output 0 and lse -inf, and so passes no
 * gradient (PyTorch's SDPA gives NaN there; zeros keep the other rows' gradients finite).
 *
 * In 16 bits all the kernels run as their f32 selves on staged (batch, head) slices
 * (lowp.c): a group of whole slices of q, k, v (o, dout) converted to f32, the outputs
 * rounded back; under grouped-query attention the staged slabs are whole batch items
 * (every head), so that each group holds its kv heads with their query heads. lse stays f32 and is read and written where it lies.
 */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "cpu_impl.h"

#define BQ 64  // query rows per tile
#define BK 64  // keys per tile, at most
#define GEMM_SERIAL_MNK 262144

/* Where row i of (batch, head) slice s starts: s / nh * b + s % nh * h + i * r elements in. */
typedef struct {
    int64_t nh, b, h, r;
} Lay;

static inline int64_t lay_at(const Lay *l, int64_t s, int64_t i)
{
    return s / l->nh * l->b + s % l->nh * l->h + i * l->r;
}
static Lay lay_dense(int64_t rows, int64_t width) { return (Lay){1, rows * width, 0, width}; }

typedef struct {
    const float *q, *k, *v, *o, *lse, *dout;  // o, lse, dout: backward only
    float *out, *lse_out, *dq, *dk, *dv;
    Lay lq, lk, lv, lo;  // q and dq, k and dk, v and dv, o and dout
    int64_t BH, G, T, S, D, Dv, bk;  // G: query slices per kv slice
    float scale;
    int causal;
    int64_t at;  // causal: query row i is at position at + i (attention_decode; else 0)
    const int32_t *mask;  // attention_masked's boolean mask [B, S], slices bh read row bh / mper; else NULL
    const float *bias;    // or its additive one, likewise; else NULL
    int64_t mper;
} Att;

/* The mask m ([B, S]) of the B batch items whose slices are a's BH: i32 boolean, f32 additive. */
static void att_mask(Att *a, const KTensor *m)
{
    KCHECK((m->dtype == KT_I32 || m->dtype == KT_F32) && m->rank == 2 && m->shape[1] == a->S &&
               a->BH % m->shape[0] == 0,
           "attention_masked: the mask must be i32 or f32 [B, S]");
    if (m->dtype == KT_I32) a->mask = idata(m);
    else a->bias = fdata(m);
    a->mper = a->BH / m->shape[0];
}

/* masked: input 3 is attention_masked's mask (o, lse, dout follow it). */
static void att_init(Att *a, const KCall *k, int causal, int masked)
{
    const KTensor *q = &k->in[0], *kk = &k->in[1], *v = &k->in[2];
    int r = q->rank;
    int ok = q->dtype == KT_F32 && kk->dtype == KT_F32 && v->dtype == KT_F32;
    for (int i = 3 + masked; i < k->n_in; i++) ok &= k->in[i].dtype == KT_F32;  // o, lse, dout
    KCHECK(ok, "attention: unsupported dtype");
    a->T = q->shape[r - 2], a->D = q->shape[r - 1], a->S = kk->shape[r - 2], a->Dv = v->shape[r - 1];
    a->BH = q->numel / (a->T * a->D);
    int64_t bkv = kk->numel / (a->S * a->D);
    KCHECK(kk->shape[r - 1] == a->D && v->shape[r - 2] == a->S && (!causal || a->T == a->S) && a->BH % bkv == 0 &&
               v->numel == bkv * a->S * a->Dv,
           "attention: bad shapes");
    a->G = a->BH / bkv;
    int64_t dmax = imax(a->D, a->Dv);
    a->bk = imax(8, imin(BK, GEMM_SERIAL_MNK / (BQ * dmax)));
    a->scale = 1.0f / sqrtf((float)a->D);
    a->causal = causal, a->at = 0;
    a->q = fdata(q), a->k = fdata(kk), a->v = fdata(v);
    a->lq = lay_dense(a->T, a->D), a->lk = lay_dense(a->S, a->D), a->lv = lay_dense(a->S, a->Dv);
    a->lo = lay_dense(a->T, a->Dv);
    a->mask = NULL, a->bias = NULL, a->mper = 1;
    if (masked) att_mask(a, &k->in[3]);
}

/* attention_qkv's geometry: qkv (input 0) [..., T, (nh + 2 nkv) D], attributes nh, nkv, causal at
 * k->attr[at..]; o and dout [..., T, nh D]. masked: input 1 is attention_qkv_masked's mask. */
static void att_init_packed(Att *a, const KCall *k, int at, int masked)
{
    const KTensor *x = &k->in[0];
    for (int i = 0; i < k->n_in; i++)
        KCHECK(k->in[i].dtype == KT_F32 || (masked && i == 1), "attention_qkv: unsupported dtype");
    int64_t nh = k_int(k, at), nkv = k_int(k, at + 1), T = x->shape[x->rank - 2], W = x->shape[x->rank - 1];
    KCHECK(nh >= 1 && nkv >= 1 && nh % nkv == 0 && W % (nh + 2 * nkv) == 0, "attention_qkv: bad heads");
    int64_t D = W / (nh + 2 * nkv), B = x->numel / (T * W);
    *a = (Att){.T = T, .S = T, .D = D, .Dv = D, .BH = B * nh, .G = nh / nkv, .causal = k_int(k, at + 2)};
    a->bk = imax(8, imin(BK, GEMM_SERIAL_MNK / (BQ * D)));
    a->scale = 1.0f / sqrtf((float)D);
    a->lq = (Lay){nh, T * W, D, W}, a->lk = (Lay){nkv, T * W, D, W}, a->lv = a->lk;
    a->lo = (Lay){nh, T * nh * D, D, nh * D};
    a->q = fdata(x), a->k = a->q + nh * D, a->v = a->k + nkv * D;
    if (masked) att_mask(a, &k->in[1]);
}

/* attention_rows' geometry: q (input 0) [..., T, nh D], k and v [..., T, nkv D], attributes nh, nkv, causal at
 * k->attr[at..]; o and dout [..., T, nh D]. Head s % nh of batch item s / nh is a column range of the rows. */
static void att_init_rows(Att *a, const KCall *k, int at)
{
    const KTensor *q = &k->in[0];
    for (int i = 0; i < k->n_in; i++) KCHECK(k->in[i].dtype == KT_F32, "attention_rows: unsupported dtype");
    int64_t nh = k_int(k, at), nkv = k_int(k, at + 1), T = q->shape[q->rank - 2], W = q->shape[q->rank - 1];
    KCHECK(nh >= 1 && nkv >= 1 && nh % nkv == 0 && W % nh == 0 && k->in[1].numel * nh == q->numel * nkv &&
               k->in[2].numel == k->in[1].numel,
           "attention_rows: bad heads");
    int64_t D = W / nh, B = q->numel / (T * W);
    *a = (Att){.T = T, .S = T, .D = D, .Dv = D, .BH = B * nh, .G = nh / nkv, .causal = k_int(k, at + 2)};
    a->bk = imax(8, imin(BK, GEMM_SERIAL_MNK / (BQ * D)));
    a->scale = 1.0f / sqrtf((float)D);
    a->lq = a->lo = (Lay){nh, T * W, D, W}, a->lk = a->lv = (Lay){nkv, T * nkv * D, D, nkv * D};
    a->q = fdata(q), a->k = fdata(&k->in[1]), a->v = fdata(&k->in[2]);
}

/* Rows i0 .. i0 + n - 1 of slice s of a tensor of layout l, `width` elements each, to 0. */
static void zero_rows(float *x, const Lay *l, int64_t s, int64_t i0, int64_t n, int64_t width)
{
    for (int64_t i = i0; i < i0 + n; i++) memset(x + lay_at(l, s, i), 0, sizeof(float) * (size_t)width);
}

/* The causal mask of tile (query block i0, key block j0): its key c is seen by its query
 * rows r >= result + c (every row, without the mask: no tile is wider than BK). */
static int64_t first_seer(const Att *a, int64_t i0, int64_t j0) { return a->causal ? j0 - a->at - i0 : -BK; }

/* Key j's additive bias for slice bh: 0 without one. */
static float bias_of(const Att *a, int64_t bh, int64_t j) { return a->bias ? a->bias[bh / a->mper * a->S + j] : 0.0f; }

/* The first row of a tile that sees key c, first = first_seer: first + c, or none (past every
 * row) when the mask hides the key from slice bh (boolean 0, additive -inf). */
static int64_t seer_of(const Att *a, int64_t bh, int64_t j0, int64_t c, int64_t first)
{
    int hidden = a->mask ? !a->mask[bh / a->mper * a->S + j0 + c] : bias_of(a, bh, j0 + c) == -INFINITY;
    return hidden ? INT64_MAX : first + c;
}

/* ---- forward ---------------------------------------------------------------------- */

/* One query block's forward. Each score tile is computed transposed, st [keys, queries]
 * = scale K_j Q^T, so that a query's statistics over the keys (the running max m, the
 * sum l) are vertical: every loop runs along the queries, in vectors, with no per-row
 * horizontal reductions; a query row's keys are summed in key order. */
KSIMD static void fwd_block(const Att *a, int64_t bh, int64_t i0)
{
    int64_t nq = imin(BQ, a->T - i0), D = a->D, Dv = a->Dv;
    int64_t jend = a->causal ? imin(a->S, a->at + i0 + nq) : a->S;
    const float *q = a->q + lay_at(&a->lq, bh, i0);
    int64_t ldo = a->lo.r;
    float *o = a->out + lay_at(&a->lo, bh, i0), st[BK * BQ], m[BQ], l[BQ], mx[BQ], corr[BQ];
    for (int64_t r = 0; r < nq; r++) m[r] = -INFINITY, l[r] = 0;
    zero_rows(a->out, &a->lo, bh, i0, nq, Dv);
    for (int64_t j0 = 0; j0 < jend; j0 += a->bk) {
        int64_t nk = imin(a->bk, jend - j0);
        int64_t first = first_seer(a, i0, j0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nk, (int)nq, (int)D, a->scale,
                    a->k + lay_at(&a->lk, bh / a->G, j0), (int)a->lk.r, q, (int)a->lq.r, 0.0f, st, (int)nq);
        for (int64_t c = 0; a->bias && c < nk; c++) {  // an additive mask: key c's bias on its scores
            float b = bias_of(a, bh, j0 + c), *sc = st + c * nq;
            VEC_LOOP
            for (int64_t r = 0; r < nq; r++) sc[r] += b;
        }
        for (int64_t r = 0; r < nq; r++) mx[r] = m[r];
        for (int64_t c = 0; c < nk; c++) {
            const float *sc = st + c * nq;
            int64_t fc = seer_of(a, bh, j0, c, first);
            VEC_LOOP
            for (int64_t r = 0; r < nq; r++) mx[r] = r >= fc && sc[r] > mx[r] ? sc[r] : mx[r];
        }
        VEC_LOOP  // first tile: m = -inf, corr = 0
        for (int64_t r = 0; r < nq; r++) corr[r] = m[r] == mx[r] ? 1.0f : fexp(m[r] - mx[r]), l[r] *= corr[r];
        for (int64_t c = 0; c < nk; c++) {
            float *sc = st + c * nq;
            int64_t fc = seer_of(a, bh, j0, c, first);
            VEC_LOOP
            for (int64_t r = 0; r < nq; r++) {
                sc[r] = r >= fc ? fexp(sc[r] - mx[r]) : 0.0f;
                l[r] += sc[r];
            }
        }
        for (int64_t r = 0; r < nq; r++) {
            m[r] = mx[r];
            if (corr[r] == 1.0f) continue;
            VEC_LOOP
            for (int64_t c = 0; c < Dv; c++) o[r * ldo + c] *= corr[r];
        }
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nq, (int)Dv, (int)nk, 1.0f, st, (int)nq,
                    a->v + lay_at(&a->lv, bh / a->G, j0), (int)a->lv.r, 1.0f, o, (int)ldo);
    }
    for (int64_t r = 0; r < nq; r++) {
        float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;  // no key seen: 0
        VEC_LOOP
        for (int64_t c = 0; c < Dv; c++) o[r * ldo + c] *= inv;
        if (a->lse_out) a->lse_out[bh * a->T + i0 + r] = m[r] + logf(l[r]);
    }
}

/* Every (slice, query block) of a's forward. */
static void fwd_all(const Att *a)
{
    int64_t nb = (a->T + BQ - 1) / BQ;
#pragma omp parallel for if (a->BH * a->T * a->S * a->D > PAR_MIN) schedule(dynamic)
    for (int64_t t = 0; t < a->BH * nb; t++) fwd_block(a, t / nb, t % nb * BQ);
}

/* The forward's outputs (out, lse) on an initialized a, then the forward. */
static void forward(Att *a, const KCall *k)
{
    a->out = fdata(&k->out[0]), a->lse_out = fdata(&k->out[1]);
    fwd_all(a);
}

/* q, k, v -> out, lse; q, k, v, o, lse, dout -> dq, dk, dv: by (T, D) slices, or by
 * (heads, T, D) slabs when q has more heads than k. */
static const Slabs ATTENTION[2] = {{{2, 2, 2, 2, 1}, -1}, {{3, 3, 3, 3, 2}, -1}};
static const Slabs ATTENTION_BWD[2] = {{{2, 2, 2, 2, 1, 2, 2, 2, 2}, -1}, {{3, 3, 3, 3, 2, 3, 3, 3, 3}, -1}};

/* (T, D) slices of a tensor whose last two dims are them. */
static int64_t slices(const KTensor *t) { return t->numel / (t->shape[t->rank - 2] * t->shape[t->rank - 1]); }
static int grouped(const KCall *k) { return slices(&k->in[0]) != slices(&k->in[1]); }

CpuWork cpu_work_attention(const KCall *k) { return slab_work(k, &ATTENTION[grouped(k)]); }
CpuWork cpu_work_attention_bwd(const KCall *k) { return slab_work(k, &ATTENTION_BWD[grouped(k)]); }

void cpu_attention(const KCall *k)
{
    if (lowp_call(k)) {
        slab_run(k, &ATTENTION[grouped(k)], cpu_attention);
        return;
    }
    Att a;
    att_init(&a, k, k_int(k, 3), 0);
    forward(&a, k);
}

/* attention_decode(q, k, v, kcache, vcache, pos) -> out: k's and v's T rows into the
 * caches at rows pos.., then the forward above over the caches, query row i at position
 * pos + i (causal with an offset), no lse. */
void cpu_attention_decode(const KCall *k)
{
    const KTensor *q = &k->in[0], *kn = &k->in[1], *vn = &k->in[2], *kc = &k->in[3], *vc = &k->in[4];
    int ok = k->in[5].dtype == KT_I32;
    for (int i = 0; i < 5; i++) ok &= k->in[i].dtype == KT_F32;
    KCHECK(ok && q->rank >= 2 && kc->rank == q->rank, "attention_decode: f32 q, k, v, caches and an i32 pos only");
    int r = q->rank;
    int64_t T = q->shape[r - 2], S = kc->shape[r - 2], D = q->shape[r - 1], Dv = vc->shape[r - 1];
    int64_t at = idata(&k->in[5])[0], bkv = kc->numel / (S * D);
    KCHECK(at >= 0 && at + T <= S, "attention_decode: rows %lld..%lld are outside the cache's %lld", (long long)at,
           (long long)(at + T - 1), (long long)S);
    KCHECK(kn->numel == bkv * T * D && vn->numel == bkv * T * Dv && vc->numel == bkv * S * Dv &&
               q->numel % (T * D) == 0 && (q->numel / (T * D)) % bkv == 0,
           "attention_decode: bad shapes");
    for (int64_t s = 0; s < bkv; s++) {
        memcpy(fdata(kc) + (s * S + at) * D, fdata(kn) + s * T * D, sizeof(float) * (size_t)(T * D));
        memcpy(fdata(vc) + (s * S + at) * Dv, fdata(vn) + s * T * Dv, sizeof(float) * (size_t)(T * Dv));
    }
    Att a = {.q = fdata(q), .k = fdata(kc), .v = fdata(vc), .out = fdata(&k->out[0]), .BH = q->numel / (T * D), .T = T,
             .S = S, .D = D, .Dv = Dv, .scale = 1.0f / sqrtf((float)D), .causal = 1, .at = at};
    a.G = a.BH / bkv;
    a.bk = imax(8, imin(BK, GEMM_SERIAL_MNK / (BQ * imax(D, Dv))));
    a.lq = lay_dense(T, D), a.lk = lay_dense(S, D), a.lv = lay_dense(S, Dv), a.lo = lay_dense(T, Dv);
    fwd_all(&a);
}

/* ---- backward --------------------------------------------------------------------- */

/* One (query block i0, key block j0) tile of slice bh; dr holds rowsum(dO * O). */
KSIMD static void bwd_tile(const Att *a, int64_t bh, int64_t i0, int64_t j0, const float *dr, int do_kv, int do_q)
{
    int64_t nq = imin(BQ, a->T - i0), nk = imin(a->bk, a->S - j0), D = a->D, Dv = a->Dv;
    int64_t kv = bh / a->G;
    const float *q = a->q + lay_at(&a->lq, bh, i0), *kj = a->k + lay_at(&a->lk, kv, j0);
    const float *vj = a->v + lay_at(&a->lv, kv, j0), *go = a->dout + lay_at(&a->lo, bh, i0);
    int ldq = (int)a->lq.r, ldk = (int)a->lk.r, ldv = (int)a->lv.r, ldo = (int)a->lo.r;
    const float *lse = a->lse + bh * a->T + i0;
    float p[BQ * BK], ds[BQ * BK];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)nk, (int)D, a->scale, q, ldq, kj, ldk, 0.0f, p,
                (int)nk);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)nk, (int)Dv, 1.0f, go, ldo, vj, ldv, 0.0f, ds,
                (int)nk);
    int64_t first = first_seer(a, i0, j0), fc[BK];
    float bc[BK];  // the keys' additive biases (0 without: adding it changes nothing)
    for (int64_t c = 0; c < nk; c++) fc[c] = seer_of(a, bh, j0, c, first), bc[c] = bias_of(a, bh, j0 + c);
    for (int64_t r = 0; r < nq; r++) {
        float *pr = p + r * nk, *dsr = ds + r * nk;
        float l = lse[r], d = dr[r];
        VEC_LOOP  // the whole tile row, masked keys to 0
        for (int64_t c = 0; c < nk; c++) {
            float e = r >= fc[c] ? fexp(pr[c] + bc[c] - l) : 0.0f;
            dsr[c] = e * (dsr[c] - d);
            pr[c] = e;
        }
    }
    if (do_kv) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nk, (int)Dv, (int)nq, 1.0f, p, (int)nk, go, ldo, 1.0f,
                    a->dv + lay_at(&a->lv, kv, j0), ldv);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nk, (int)D, (int)nq, a->scale, ds, (int)nk, q, ldq,
                    1.0f, a->dk + lay_at(&a->lk, kv, j0), ldk);
    }
    if (do_q)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, (int)D, (int)nk, a->scale, ds, (int)nk, kj, ldk,
                    1.0f, a->dq + lay_at(&a->lq, bh, i0), ldq);
}

static void row_dots(const Att *a, int64_t bh, int64_t i0, float *dr)
{
    int64_t nq = imin(BQ, a->T - i0), off = lay_at(&a->lo, bh, i0);
    for (int64_t r = 0; r < nq; r++) dr[r] = vdot(a->dout + off + r * a->lo.r, a->o + off + r * a->lo.r, a->Dv);
}

/* Does tile (i0, j0) see any key? (causal: not when every key follows every query) */
static int live(const Att *a, int64_t i0, int64_t j0) { return !a->causal || j0 <= imin(a->T, i0 + BQ) - 1; }

/* kv slice kv and its G query slices. */
static void bwd_slice(const Att *a, int64_t kv)
{
    zero_rows(a->dk, &a->lk, kv, 0, a->S, a->D);
    zero_rows(a->dv, &a->lv, kv, 0, a->S, a->Dv);
    for (int64_t bh = kv * a->G; bh < (kv + 1) * a->G; bh++) {
        zero_rows(a->dq, &a->lq, bh, 0, a->T, a->D);
        for (int64_t i0 = 0; i0 < a->T; i0 += BQ) {
            float dr[BQ];
            row_dots(a, bh, i0, dr);
            for (int64_t j0 = 0; j0 < a->S && live(a, i0, j0); j0 += a->bk) bwd_tile(a, bh, i0, j0, dr, 1, 1);
        }
    }
}

static void bwd_kv_block(const Att *a, int64_t kv, int64_t j0)
{
    int64_t nk = imin(a->bk, a->S - j0);
    zero_rows(a->dk, &a->lk, kv, j0, nk, a->D);
    zero_rows(a->dv, &a->lv, kv, j0, nk, a->Dv);
    for (int64_t bh = kv * a->G; bh < (kv + 1) * a->G; bh++)
        for (int64_t i0 = 0; i0 < a->T; i0 += BQ) {
            if (!live(a, i0, j0)) continue;
            float dr[BQ];
            row_dots(a, bh, i0, dr);
            bwd_tile(a, bh, i0, j0, dr, 1, 0);
        }
}

static void bwd_q_block(const Att *a, int64_t bh, int64_t i0)
{
    float dr[BQ];
    zero_rows(a->dq, &a->lq, bh, i0, imin(BQ, a->T - i0), a->D);
    row_dots(a, bh, i0, dr);
    for (int64_t j0 = 0; j0 < a->S && live(a, i0, j0); j0 += a->bk) bwd_tile(a, bh, i0, j0, dr, 0, 1);
}

/* Every gradient of a: by kv slices when there are enough of them for the threads, else by
 * (kv slice, key block) and then (query slice, query block) tasks. */
static void bwd_all(const Att *ap)
{
    const Att a = *ap;
    int par = a.BH * a.T * a.S * a.D > PAR_MIN;
    int64_t threads = par ? omp_get_max_threads() : 1, bkv = a.BH / a.G;
    if (bkv >= 2 * threads || bkv % threads == 0) {
#pragma omp parallel for if (par) schedule(dynamic)
        for (int64_t kv = 0; kv < bkv; kv++) bwd_slice(&a, kv);
        return;
    }
    int64_t nkb = (a.S + a.bk - 1) / a.bk, nqb = (a.T + BQ - 1) / BQ;
#pragma omp parallel for schedule(dynamic)
    for (int64_t t = 0; t < bkv * nkb; t++) bwd_kv_block(&a, t / nkb, t % nkb * a.bk);
#pragma omp parallel for schedule(dynamic)
    for (int64_t t = 0; t < a.BH * nqb; t++) bwd_q_block(&a, t / nqb, t % nqb * BQ);
}

/* The backward's o, lse, dout (inputs at, at + 1, at + 2) and dq, dk, dv (three outputs, or, packed,
 * the parts of one dqkv) on an initialized a, then the backward. */
static void backward(Att *a, const KCall *k, int at, int packed)
{
    a->o = fdata(&k->in[at]), a->lse = fdata(&k->in[at + 1]), a->dout = fdata(&k->in[at + 2]);
    a->dq = fdata(&k->out[0]);
    a->dk = packed ? a->dq + a->lq.nh * a->D : fdata(&k->out[1]);
    a->dv = packed ? a->dk + a->lk.nh * a->D : fdata(&k->out[2]);
    bwd_all(a);
}

/* attention_bwd(q, k, v, o, lse, dout, causal) -> dq, dk, dv */
void cpu_attention_bwd(const KCall *k)
{
    if (lowp_call(k)) {
        slab_run(k, &ATTENTION_BWD[grouped(k)], cpu_attention_bwd);
        return;
    }
    Att a;
    att_init(&a, k, k_int(k, 6), 0);
    backward(&a, k, 3, 0);
}

/* attention_masked(q, k, v, mask, causal) -> out, lse; its backward (q, k, v, mask, o, lse, dout) -> dq, dk,
 * dv: by whole batch items (every head of an item reads its mask row); an i32 mask as it is, a 16-bit
 * (additive) one staged as f32 like the rest. */
static Slabs masked_slabs(const KCall *k, int bwd)
{
    int8_t r = (int8_t)k->in[0].rank;
    Slabs f = {{r - 1, r - 1, r - 1, 1, r - 1, r - 2}, -1};
    Slabs b = {{r - 1, r - 1, r - 1, 1, r - 1, r - 2, r - 1, r - 1, r - 1, r - 1}, -1};
    return bwd ? b : f;
}

CpuWork cpu_work_attention_masked(const KCall *k)
{
    Slabs s = masked_slabs(k, 0);
    return slab_work(k, &s);
}
CpuWork cpu_work_attention_masked_bwd(const KCall *k)
{
    Slabs s = masked_slabs(k, 1);
    return slab_work(k, &s);
}

void cpu_attention_masked(const KCall *k)
{
    if (lowp_call(k)) {
        Slabs s = masked_slabs(k, 0);
        slab_run(k, &s, cpu_attention_masked);
        return;
    }
    Att a;
    att_init(&a, k, k_int(k, 4), 1);
    forward(&a, k);
}

void cpu_attention_masked_bwd(const KCall *k)
{
    if (lowp_call(k)) {
        Slabs s = masked_slabs(k, 1);
        slab_run(k, &s, cpu_attention_masked_bwd);
        return;
    }
    Att a;
    att_init(&a, k, k_int(k, 7), 1);
    backward(&a, k, 4, 0);
}

/* attention_qkv(qkv, nh, nkv, causal) -> o, lse; its backward (qkv, o, lse, dout) -> dqkv: by batch items
 * (every head of a row is in its item). */
static const Slabs ATTENTION_QKV = {{2, 2, 2}, -1};
static const Slabs ATTENTION_QKV_BWD = {{2, 2, 2, 2, 2}, -1};

CpuWork cpu_work_attention_qkv(const KCall *k) { return slab_work(k, &ATTENTION_QKV); }
CpuWork cpu_work_attention_qkv_bwd(const KCall *k) { return slab_work(k, &ATTENTION_QKV_BWD); }

/* attention_qkv's forward (masked: attention_qkv_masked's, the mask input 1), its attributes from k->attr[at]. */
static void packed_fwd(const KCall *k, const Slabs *s, CpuKernel self, int at, int masked)
{
    if (lowp_call(k)) {
        slab_run(k, s, self);
        return;
    }
    Att a;
    att_init_packed(&a, k, at, masked);
    forward(&a, k);
}

/* Their backward: o, lse, dout follow qkv (and the mask). */
static void packed_bwd(const KCall *k, const Slabs *s, CpuKernel self, int at, int masked)
{
    if (lowp_call(k)) {
        slab_run(k, s, self);
        return;
    }
    Att a;
    att_init_packed(&a, k, at, masked);
    backward(&a, k, 1 + masked, 1);
}

void cpu_attention_qkv(const KCall *k) { packed_fwd(k, &ATTENTION_QKV, cpu_attention_qkv, 1, 0); }
void cpu_attention_qkv_bwd(const KCall *k) { packed_bwd(k, &ATTENTION_QKV_BWD, cpu_attention_qkv_bwd, 4, 0); }

/* attention_qkv_masked(qkv, mask, nh, nkv, causal) -> o, lse; its backward (qkv, mask, o, lse, dout) -> dqkv:
 * attention_qkv's, by batch items, with the mask's row of each (an i32 one as it is, a 16-bit one staged). */
static const Slabs ATTENTION_QKV_MASKED = {{2, 1, 2, 2}, -1};
static const Slabs ATTENTION_QKV_MASKED_BWD = {{2, 1, 2, 2, 2, 2}, -1};

CpuWork cpu_work_attention_qkv_masked(const KCall *k) { return slab_work(k, &ATTENTION_QKV_MASKED); }
CpuWork cpu_work_attention_qkv_masked_bwd(const KCall *k) { return slab_work(k, &ATTENTION_QKV_MASKED_BWD); }

void cpu_attention_qkv_masked(const KCall *k)
{
    packed_fwd(k, &ATTENTION_QKV_MASKED, cpu_attention_qkv_masked, 2, 1);
}

void cpu_attention_qkv_masked_bwd(const KCall *k)
{
    packed_bwd(k, &ATTENTION_QKV_MASKED_BWD, cpu_attention_qkv_masked_bwd, 5, 1);
}

/* attention_rows(q, k, v, nh, nkv, causal) -> o, lse; its backward (q, k, v, o, lse, dout) -> dq, dk, dv: by batch
 * items, as attention_qkv. */
static const Slabs ATTENTION_ROWS = {{2, 2, 2, 2, 2}, -1};
static const Slabs ATTENTION_ROWS_BWD = {{2, 2, 2, 2, 2, 2, 2, 2, 2}, -1};

CpuWork cpu_work_attention_rows(const KCall *k) { return slab_work(k, &ATTENTION_ROWS); }
CpuWork cpu_work_attention_rows_bwd(const KCall *k) { return slab_work(k, &ATTENTION_ROWS_BWD); }

void cpu_attention_rows(const KCall *k)
{
    if (lowp_call(k)) {
        slab_run(k, &ATTENTION_ROWS, cpu_attention_rows);
        return;
    }
    Att a;
    att_init_rows(&a, k, 3);
    forward(&a, k);
}

void cpu_attention_rows_bwd(const KCall *k)
{
    if (lowp_call(k)) {
        slab_run(k, &ATTENTION_ROWS_BWD, cpu_attention_rows_bwd);
        return;
    }
    Att a;
    att_init_rows(&a, k, 6);
    backward(&a, k, 3, 0);
}

/* ---- rope ------------------------------------------------------------------------- */

#define ROPE_PAIRS 256  // (cos, sin) pairs per stack table; longer heads go in pieces

/* rope(x [..., T, D], theta, inverse, interleaved): pairs (i, i + D/2) of the row at
 * position t (rotate-half; interleaved: (2i, 2i + 1), GPT-J's rotate_every_two) turn by
 * t * theta^(-2i/D) (backwards under inverse, which is also rope's backward). */
static const Slabs ROPE = {{2, 2}, -1};  // x -> y by (T, D) slices

CpuWork cpu_work_rope(const KCall *k) { return slab_work(k, &ROPE); }

/* Rows t of x [..., T, n D] turned as at positions at + t, each of a row's n heads of D (rope: n = 1); pair i of
 * a head is (i, i + D/2), or (2i, 2i + 1) when interleaved. */
static void rope_turn(const KCall *k, int64_t at, double theta, double sign, int interleaved, int64_t n)
{
    const KTensor *X = &k->in[0];
    KCHECK(X->dtype == KT_F32 && X->rank >= 2 && n >= 1 && X->shape[X->rank - 1] % (2 * n) == 0, "rope: bad input");
    int64_t T = X->shape[X->rank - 2], W = X->shape[X->rank - 1], D = W / n, H = D / 2, outer = X->numel / (T * W);
    const float *x = fdata(X);
    float *y = fdata(&k->out[0]);
#pragma omp parallel for if (X->numel > PAR_MIN) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        float cs[ROPE_PAIRS], sn[ROPE_PAIRS];
        for (int64_t h0 = 0; h0 < H; h0 += ROPE_PAIRS) {
            int64_t nh = imin(ROPE_PAIRS, H - h0);
            for (int64_t i = 0; i < nh; i++) {
                double ang = sign * (double)(at + t) * pow(theta, -2.0 * (double)(h0 + i) / (double)D);
                cs[i] = (float)cos(ang), sn[i] = (float)sin(ang);
            }
            int64_t s = interleaved ? 2 : 1, first = s * h0, second = interleaved ? 1 : H;  // element of pair i: s i
            for (int64_t o = 0; o < outer * n; o++) {  // head o % n of row (o / n, t)
                int64_t row = ((o / n) * T + t) * W + o % n * D + first;
                const float *a = x + row, *b = a + second;
                float *ya = y + row, *yb = ya + second;
                VEC_LOOP
                for (int64_t i = 0; i < nh; i++) {
                    float u = a[s * i], w = b[s * i];
                    ya[s * i] = u * cs[i] - w * sn[i];
                    yb[s * i] = w * cs[i] + u * sn[i];
                }
            }
        }
    }
}

void cpu_rope(const KCall *k)
{
    if (lowp_call(k)) {
        slab_run(k, &ROPE, cpu_rope);
        return;
    }
    rope_turn(k, 0, k->attr[1], k_int(k, 2) ? -1.0 : 1.0, k_int(k, 3), 1);
}

/* rope_at(x, pos, theta, inverse, interleaved): rope with row t at position pos + t. */
static const Slabs ROPE_AT = {{2, SLAB_WHOLE, 2}, -1};  // x -> y by (T, D) slices; pos whole (i32: not staged)

CpuWork cpu_work_rope_at(const KCall *k) { return slab_work(k, &ROPE_AT); }

void cpu_rope_at(const KCall *k)
{
    if (lowp_call(k)) {
        slab_run(k, &ROPE_AT, cpu_rope_at);
        return;
    }
    KCHECK(k->in[1].dtype == KT_I32 && k->in[1].numel == 1, "rope_at: pos must be an i32 [1]");
    rope_turn(k, idata(&k->in[1])[0], k->attr[2], k_int(k, 3) ? -1.0 : 1.0, k_int(k, 4), 1);
}

/* rope_rows(x [..., T, n D], n, theta, inverse, interleaved): rope of each of a row's n heads where it lies. */
CpuWork cpu_work_rope_rows(const KCall *k) { return slab_work(k, &ROPE); }

void cpu_rope_rows(const KCall *k)
{
    if (lowp_call(k)) {
        slab_run(k, &ROPE, cpu_rope_rows);
        return;
    }
    rope_turn(k, 0, k->attr[2], k_int(k, 3) ? -1.0 : 1.0, k_int(k, 4), k_int(k, 1));
}
