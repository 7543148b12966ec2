/* runtime/cpu/embed.c: table lookups, the loss, and constants: embedding (+ bwd),
 * cross_entropy (+ bwd), arange, scalar, full.
 *
 * An index outside the table (or a target outside the vocabulary) is a broken plan or
 * bad data: the kernel stops with file:line rather than read out of bounds.
 * embedding_bwd scatters without atomics: each task owns a range of columns and walks
 * the indices in order, so repeated indices add up in one fixed order. The loss sums
 * per-row terms in double over a fixed partition of the rows.
 */
#include <math.h>
#include <string.h>

#include "cpu_impl.h"

#define LOSS_BLOCKS 64  // fixed partition of the rows: the sum does not depend on threads

void cpu_embedding(const KCall *k)
{
    const KTensor *T = &k->in[0], *I = &k->in[1];
    KCHECK(T->dtype == KT_F32 && I->dtype == KT_I32, "embedding: unsupported dtypes %d, %d", T->dtype, I->dtype);
    int64_t V = T->shape[0], C = T->shape[1], n = I->numel;
    const float *table = fdata(T);
    const int32_t *idx = idata(I);
    float *out = fdata(&k->out[0]);
#pragma omp parallel for if (n * C > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        KCHECK(idx[i] >= 0 && idx[i] < V, "embedding: index %d at %lld outside [0, %lld)", idx[i], (long long)i, (long long)V);
        memcpy(out + i * C, table + (int64_t)idx[i] * C, sizeof(float) * (size_t)C);
    }
}

/* embedding_bwd(idx, dy, rows) -> dtable [rows, C]: zeros, then dy's rows added at idx. */
void cpu_embedding_bwd(const KCall *k)
{
    const KTensor *I = &k->in[0], *O = &k->out[0];
    int64_t V = O->shape[0], C = O->shape[1], n = I->numel;
    const int32_t *idx = idata(I);
    const float *dy = fdata(&k->in[1]);
    float *dt = fdata(O);
#pragma omp parallel for if (V * C > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < V; r++) memset(dt + r * C, 0, sizeof(float) * (size_t)C);
    int64_t ch = col_chunk(1, C), nch = (C + ch - 1) / ch;
#pragma omp parallel for if (n * C > PAR_MIN) schedule(static)
    for (int64_t t = 0; t < nch; t++) {
        int64_t c0 = t * ch, len = imin(ch, C - c0);
        for (int64_t i = 0; i < n; i++) {
            KCHECK(idx[i] >= 0 && idx[i] < V, "embedding_bwd: index %d at %lld outside [0, %lld)", idx[i], (long long)i,
                   (long long)V);
            float *row = dt + (int64_t)idx[i] * C + c0;
            const float *g = dy + i * C + c0;
            VEC_LOOP
            for (int64_t c = 0; c < len; c++) row[c] += g[c];
        }
    }
}

/* logsumexp of one row: the max, then the sum of exp in lanes. */
KSIMD static float logsumexp(const float *x, int64_t V)
{
    float m = row_max(x, V), a[LANES] = {0}, s = 0;
    int64_t j = 0;
    for (; j + LANES <= V; j += LANES)
        VEC_LOOP
        for (int l = 0; l < LANES; l++) a[l] += fexp(x[j + l] - m);
    for (; j < V; j++) s += fexp(x[j] - m);
    for (int l = 0; l < LANES; l++) s += a[l];
    return m + logf(s);
}

static int32_t target_at(const int32_t *tg, int64_t r, int64_t V)
{
    KCHECK(tg[r] >= 0 && tg[r] < V, "cross_entropy: target %d at %lld outside [0, %lld)", tg[r], (long long)r, (long long)V);
    return tg[r];
}

/* cross_entropy(logits [..., V], targets [...]) -> mean of logsumexp(row) - row[target]. */
void cpu_cross_entropy(const KCall *k)
{
    const KTensor *L = &k->in[0];
    KCHECK(L->dtype == KT_F32 && k->in[1].dtype == KT_I32, "cross_entropy: unsupported dtypes");
    int64_t V = L->shape[L->rank - 1], rows = L->numel / V, bs = (rows + LOSS_BLOCKS - 1) / LOSS_BLOCKS;
    const float *x = fdata(L);
    const int32_t *tg = idata(&k->in[1]);
    double part[LOSS_BLOCKS];
#pragma omp parallel for if (L->numel > PAR_MIN) schedule(static)
    for (int b = 0; b < LOSS_BLOCKS; b++) {
        double s = 0;
        for (int64_t r = imin(rows, b * bs); r < imin(rows, (b + 1) * bs); r++)
            s += (double)logsumexp(x + r * V, V) - x[r * V + target_at(tg, r, V)];
        part[b] = s;
    }
    double s = 0;
    for (int b = 0; b < LOSS_BLOCKS; b++) s += part[b];
    fdata(&k->out[0])[0] = (float)(s / (double)rows);
}

/* One row of dlogits: softmax(x) * g, less g at the target. */
KSIMD static void ce_grad_row(const float *x, float *dx, int64_t V, int32_t target, float g)
{
    float m = row_max(x, V);
    VEC_LOOP
    for (int64_t j = 0; j < V; j++) dx[j] = fexp(x[j] - m);
    float f = g / vsum(dx, V);
    VEC_LOOP
    for (int64_t j = 0; j < V; j++) dx[j] *= f;
    dx[target] -= g;
}

/* dlogits = (softmax(row) - onehot(target)) * dloss / rows */
void cpu_cross_entropy_bwd(const KCall *k)
{
    const KTensor *L = &k->in[0];
    int64_t V = L->shape[L->rank - 1], rows = L->numel / V;
    const float *x = fdata(L);
    const int32_t *tg = idata(&k->in[1]);
    float *dx = fdata(&k->out[0]), g = fdata(&k->in[2])[0] / (float)rows;
#pragma omp parallel for if (L->numel > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) ce_grad_row(x + r * V, dx + r * V, V, target_at(tg, r, V), g);
}

/* ---- constants ---------------------------------------------------------------------- */

void cpu_arange(const KCall *k)
{
    int32_t *o = idata(&k->out[0]);
    for (int64_t i = 0; i < k->out[0].numel; i++) o[i] = (int32_t)i;
}

void cpu_scalar(const KCall *k) { fdata(&k->out[0])[0] = (float)k->attr[0]; }

/* full(value, shape): every element of the output (f32 or i32) set to value. */
void cpu_full(const KCall *k)
{
    const KTensor *o = &k->out[0];
    int64_t n = o->numel;
    if (o->dtype == KT_I32) {
        int32_t v = (int32_t)k->attr[0], *p = idata(o);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) p[i] = v;
        return;
    }
    KCHECK(o->dtype == KT_F32, "full: unsupported dtype %d", o->dtype);
    float v = (float)k->attr[0], *p = fdata(o);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) p[i] = v;
}
