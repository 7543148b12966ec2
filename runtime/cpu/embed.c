/* runtime/cpu/embed.c: table lookups, the loss, and constants: embedding (+ bwd),
 * embedding_bwd_into, cross_entropy (+ bwd, + the two fused), arange, scalar, full, buffer.
 *
 * An index outside the table (or a target outside the vocabulary) is a broken plan or
 * bad data: the kernel stops with file:line rather than read out of bounds.
 * embedding_bwd scatters without atomics: each task owns a range of columns and walks
 * the indices in order, so repeated indices add up in one fixed order. The loss sums
 * per-row terms in double over a fixed partition of the rows.
 *
 * In 16 bits, embedding copies elements of any size; embedding_bwd sums dy in f32 in
 * the workspace ([V, a block of columns] at a time, same order) and rounds once; the
 * loss and its gradient stage one row per thread in the workspace and run the f32 row
 * functions on it.
 */
#include <math.h>
#include <string.h>

#include "cpu_impl.h"
#include "ops.h"  // OPS_LOSS_BLOCKS


void cpu_embedding(const KCall *k)
{
    const KTensor *T = &k->in[0], *I = &k->in[1];
    KCHECK(T->dtype != KT_I32 && I->dtype == KT_I32 && k->out[0].dtype == T->dtype, "embedding: unsupported dtypes %d, %d",
           T->dtype, I->dtype);
    int64_t V = T->shape[0], C = T->shape[1], n = I->numel;
    size_t row = (size_t)(C * esize(T->dtype));
    const char *table = T->data;
    const int32_t *idx = idata(I);
    char *out = k->out[0].data;
#pragma omp parallel for if (n * C > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        KCHECK(idx[i] >= 0 && idx[i] < V, "embedding: index %d at %lld outside [0, %lld)", idx[i], (long long)i, (long long)V);
        memcpy(out + (size_t)i * row, table + (size_t)idx[i] * row, row);
    }
}

static void check_indices(const int32_t *idx, int64_t n, int64_t V)
{
    for (int64_t i = 0; i < n; i++)
        KCHECK(idx[i] >= 0 && idx[i] < V, "embedding_bwd: index %d at %lld outside [0, %lld)", idx[i], (long long)i,
               (long long)V);
}

/* Workspace: f32 sums for every row of the table, one column (least) or all of them. */
CpuWork cpu_work_embedding_bwd(const KCall *k)
{
    if (!lowp_call(k)) return (CpuWork){0, 0};
    return (CpuWork){(size_t)k->out[0].shape[0], (size_t)k->out[0].numel};
}

#define ROWS_PER_TASK 1024  // table rows a task of the 16-bit embedding_bwd owns

/* 16 bits: for each block of w columns, acc [V, w] = 0 (into: O's rows), dy's rows
 * added at idx in index order (each task owns a range of table rows), then rounded into O. */
static void embedding_bwd_lowp(const KCall *k, const KTensor *I, const KTensor *DY, const KTensor *O, int into)
{
    int64_t V = O->shape[0], C = O->shape[1], n = I->numel;
    const int32_t *idx = idata(I);
    KCHECK(k->work && k->work_floats >= (size_t)V, "embedding_bwd: a 16-bit call needs a workspace of %lld floats, has %zu",
           (long long)V, k->work ? k->work_floats : 0);
    check_indices(idx, n, V);
    int64_t cw = imin(C, (int64_t)(k->work_floats / (size_t)V)), tasks = (V + ROWS_PER_TASK - 1) / ROWS_PER_TASK;
    float *acc = k->work;
    for (int64_t c0 = 0; c0 < C; c0 += cw) {
        int64_t w = imin(cw, C - c0);
#pragma omp parallel for if (n * w > PAR_MIN || V * w > PAR_MIN) schedule(static)
        for (int64_t t = 0; t < tasks; t++) {
            int64_t r0 = t * ROWS_PER_TASK, r1 = imin(V, r0 + ROWS_PER_TASK);
            for (int64_t r = r0; r < r1; r++)
                if (into) to_f32(acc + r * w, O->data, O->dtype, r * C + c0, w);
                else memset(acc + r * w, 0, sizeof(float) * (size_t)w);
            for (int64_t i = 0; i < n; i++)
                if (idx[i] >= r0 && idx[i] < r1) add_to_f32(acc + (int64_t)idx[i] * w, DY->data, DY->dtype, i * C + c0, w);
            for (int64_t r = r0; r < r1; r++) from_f32(O->data, O->dtype, r * C + c0, acc + r * w, w);
        }
    }
}

/* O [rows, C] = 0 (into: as it is), then dy's rows added at idx, each element in index order. */
static void embedding_bwd_rows(const KCall *k, const KTensor *I, const KTensor *DY, const KTensor *O, int into)
{
    if (lowp(O->dtype) || lowp(DY->dtype)) {
        embedding_bwd_lowp(k, I, DY, O, into);
        return;
    }
    KCHECK(DY->dtype == KT_F32 && O->dtype == KT_F32, "embedding_bwd: unsupported dtypes %d, %d", DY->dtype, O->dtype);
    int64_t V = O->shape[0], C = O->shape[1], n = I->numel;
    const int32_t *idx = idata(I);
    const float *dy = fdata(DY);
    float *dt = fdata(O);
    if (!into) {
#pragma omp parallel for if (V * C > PAR_MIN) schedule(static)
        for (int64_t r = 0; r < V; r++) memset(dt + r * C, 0, sizeof(float) * (size_t)C);
    }
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

/* embedding_bwd(idx, dy, rows) -> dtable [rows, C]: zeros, then dy's rows added at idx. */
void cpu_embedding_bwd(const KCall *k) { embedding_bwd_rows(k, &k->in[0], &k->in[1], &k->out[0], 0); }

/* embedding_bwd_into(acc, idx, dy) -> acc with dy's rows added at idx, in place
 * (passes/embed_into.c): no dense table of its own, no add after. */
void cpu_embedding_bwd_into(const KCall *k)
{
    const KTensor *A = &k->in[0], *O = &k->out[0];
    KCHECK(O->data == A->data && O->dtype == A->dtype && O->numel == A->numel,
           "embedding_bwd_into: its output must lie on acc");
    embedding_bwd_rows(k, &k->in[1], &k->in[2], O, 1);
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

/* Row r's target: in [0, V), or the ignore index (ignore: OPS_NO_IGNORE when none). */
static int32_t target_at(const int32_t *tg, int64_t r, int64_t V, int64_t ignore)
{
    KCHECK((tg[r] >= 0 && tg[r] < V) || tg[r] == ignore, "cross_entropy: target %d at %lld outside [0, %lld)", tg[r],
           (long long)r, (long long)V);
    return tg[r];
}

/* The rows whose target counts: every row but the ignored ones. An exact integer. */
static int64_t counted_rows(const int32_t *tg, int64_t rows, int64_t ignore)
{
    int64_t n = rows;
    for (int64_t r = 0; r < rows && ops_ignores(ignore); r++) n -= tg[r] == ignore;
    return n;
}

/* Each counted row's share g of dloss: dloss itself when the compiler divided it already
 * (per_row: ir/grad.c's target_count), else dloss / counted rows. No row counts: 0 (its
 * rows' gradients are 0 whatever g is, and g stays finite). */
static float row_share(float dloss, int64_t counted, int per_row)
{
    if (per_row) return dloss;
    return counted ? dloss / (float)counted : 0.f;
}

/* target_count(targets; ignore_index): the targets that count, an exact f32 (below 2^24). */
void cpu_target_count(const KCall *k)
{
    KCHECK(k->in[0].dtype == KT_I32 && k->out[0].dtype == KT_F32, "target_count: i32 targets, f32 count");
    fdata(&k->out[0])[0] = (float)counted_rows(idata(&k->in[0]), k->in[0].numel, (int64_t)k->attr[1]);
}

/* A row's loss term, logsumexp(x) - x[t] in f64, its two parts kept in terms[0..1]. */
static double row_term(const float *x, int64_t V, int32_t t, float *terms)
{
    terms[0] = logsumexp(x, V), terms[1] = x[t];
    return (double)terms[0] - terms[1];
}

/* Workspace: one row of logits per thread. */
CpuWork cpu_work_cross_entropy(const KCall *k)
{
    const KTensor *L = &k->in[0];
    if (!lowp(L->dtype)) return (CpuWork){0, 0};
    size_t V = (size_t)L->shape[L->rank - 1];
    return (CpuWork){V, V * (size_t)omp_get_max_threads()};
}

/* One row of dlogits: softmax(x) * g over its first W columns, less g at the target (dx
 * may be x); columns [W, V), a padded vocabulary's, are -inf to the softmax: 0. */
KSIMD static void ce_grad_row(const float *x, float *dx, int64_t V, int64_t W, int32_t target, float g)
{
    float m = row_max(x, W);
    VEC_LOOP
    for (int64_t j = 0; j < W; j++) dx[j] = fexp(x[j] - m);
    float f = g / vsum(dx, W);
    VEC_LOOP
    for (int64_t j = 0; j < W; j++) dx[j] *= f;
    dx[target] -= g;
    for (int64_t j = W; j < V; j++) dx[j] = 0;
}

/* One row of dlogits, or zeros for an ignored row (dx may be x). */
static void grad_row(const float *x, float *dx, int64_t V, int64_t W, int32_t target, int64_t ignore, float g)
{
    if (target == ignore) memset(dx, 0, sizeof(float) * (size_t)V);
    else ce_grad_row(x, dx, V, W, target, g);
}

/* The loss's `valid` attribute (at position a of the signature): the columns of a row that
 * are the model's vocabulary (passes/pad_vocab.c); 0 means all V. */
static int64_t valid_cols(const KCall *k, int a, int64_t V)
{
    int64_t W = (int64_t)k->attr[a];
    KCHECK(W >= 0 && W <= V, "cross_entropy: valid = %lld of %lld columns", (long long)W, (long long)V);
    return W ? W : V;
}

/* The loss of logits (rows, V): each row's terms, added in double over the fixed blocks
 * of ops.h's OPS_LOSS_BLOCKS, the mean over the counted rows into out[0] (an ignored row's
 * terms are 0). With dx (cross_entropy_fused's last output, the logits' own bytes), each
 * row's gradient for g = dloss / counted rows too (0 for an ignored row), written over the
 * row once its terms are taken: the numbers cross_entropy_bwd makes. In 16 bits each row
 * is staged in f32 in the thread's part of the workspace (and rounded back). */
static void loss_rows(const KCall *k, const KTensor *dx, int64_t ignore, int64_t W, int per_row, const char *op)
{
    const KTensor *L = &k->in[0];
    KCHECK((L->dtype == KT_F32 || lowp(L->dtype)) && k->in[1].dtype == KT_I32, "%s: unsupported dtypes", op);
    int64_t V = L->shape[L->rank - 1], rows = L->numel / V, bs = (rows + OPS_LOSS_BLOCKS - 1) / OPS_LOSS_BLOCKS;
    int lp = lowp(L->dtype), nt = lp ? work_threads(k, (size_t)V, op) : omp_get_max_threads();
    const int32_t *tg = idata(&k->in[1]);
    int64_t counted = counted_rows(tg, rows, ignore);
    float g = dx ? row_share(kload(&k->in[2], 0), counted, per_row) : 0;  // dloss: f32, or any float dtype
    float *terms = fdata(&k->out[1]);
    double part[OPS_LOSS_BLOCKS];
#pragma omp parallel for num_threads(nt) if (L->numel > PAR_MIN) schedule(static)
    for (int b = 0; b < OPS_LOSS_BLOCKS; b++) {
        float *x = lp ? k->work + (size_t)omp_get_thread_num() * (size_t)V : NULL;
        double s = 0;
        for (int64_t r = imin(rows, b * bs); r < imin(rows, (b + 1) * bs); r++) {
            if (lp) to_f32(x, L->data, L->dtype, r * V, V);
            float *row = lp ? x : fdata(dx ? dx : L) + r * V;  // f32, dx: the logits' bytes
            int32_t t = target_at(tg, r, W, ignore);
            if (t == ignore) terms[2 * r] = terms[2 * r + 1] = 0;
            else s += row_term(row, W, t, terms + 2 * r);
            if (!dx) continue;
            grad_row(row, row, V, W, t, ignore, g);
            if (lp) from_f32(dx->data, dx->dtype, r * V, x, V);
        }
        part[b] = s;
    }
    double s = 0;
    for (int b = 0; b < OPS_LOSS_BLOCKS; b++) s += part[b];
    fdata(&k->out[0])[0] = counted ? (float)(s / (double)counted) : 0.f;  // every row ignored: 0 (ops.h)
}

/* cross_entropy(logits [..., V], targets [...], ignore_index, valid) -> mean over the
 * counted rows of logsumexp(row) - row[target], over the first `valid` columns. */
void cpu_cross_entropy(const KCall *k)
{
    const KTensor *L = &k->in[0];
    loss_rows(k, NULL, (int64_t)k->attr[2], valid_cols(k, 3, L->shape[L->rank - 1]), 0, "cross_entropy");
}

/* cross_entropy_fused(logits, targets, dloss): cross_entropy's outputs, and dlogits over
 * the logits (passes/xent.c). */
void cpu_cross_entropy_fused(const KCall *k)
{
    const KTensor *L = &k->in[0], *dx = &k->out[2];
    KCHECK(dx->data == L->data && dx->dtype == L->dtype && dx->numel == L->numel,
           "cross_entropy_fused: dlogits must lie on the logits");
    loss_rows(k, dx, (int64_t)k->attr[3], valid_cols(k, 4, L->shape[L->rank - 1]), k->attr[5] != 0,
              "cross_entropy_fused");
}

/* dlogits = (softmax(row) - onehot(target)) * g (row_share), 0 for an ignored row;
 * in 16 bits each row is staged in f32 in the thread's part of the workspace (as for the
 * loss) and rounded. */
void cpu_cross_entropy_bwd(const KCall *k)
{
    const KTensor *L = &k->in[0];
    const int32_t *tg = idata(&k->in[1]);
    int64_t V = L->shape[L->rank - 1], rows = L->numel / V, ignore = (int64_t)k->attr[3], W = valid_cols(k, 4, V);
    float g = row_share(kload(&k->in[2], 0), k->attr[5] != 0 ? 0 : counted_rows(tg, rows, ignore), k->attr[5] != 0);
    if (lowp(L->dtype)) {
        const KTensor *O = &k->out[0];
        int nt = work_threads(k, (size_t)V, "cross_entropy_bwd");
#pragma omp parallel for num_threads(nt) if (L->numel > PAR_MIN) schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            float *x = k->work + (size_t)omp_get_thread_num() * (size_t)V;
            to_f32(x, L->data, L->dtype, r * V, V);
            grad_row(x, x, V, W, target_at(tg, r, W, ignore), ignore, g);
            from_f32(O->data, O->dtype, r * V, x, V);
        }
        return;
    }
    KCHECK(L->dtype == KT_F32 && k->out[0].dtype == KT_F32, "cross_entropy_bwd: unsupported dtypes");
    const float *x = fdata(L);
    float *dx = fdata(&k->out[0]);
#pragma omp parallel for if (L->numel > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) grad_row(x + r * V, dx + r * V, V, W, target_at(tg, r, W, ignore), ignore, g);
}

/* ---- constants ---------------------------------------------------------------------- */

void cpu_arange(const KCall *k)
{
    int32_t *o = idata(&k->out[0]);
    for (int64_t i = 0; i < k->out[0].numel; i++) o[i] = (int32_t)i;
}

void cpu_scalar(const KCall *k) { fdata(&k->out[0])[0] = (float)k->attr[0]; }

/* buffer: nothing to write; the producers of the values inside it write its bytes. */
void cpu_buffer(const KCall *k) { (void)k; }

/* full(value, shape): every element of the output (any dtype) set to value, rounded. */
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
    if (lowp(o->dtype)) {
        uint16_t h = o->dtype == KT_F16 ? st_f16((float)k->attr[0]) : st_bf16((float)k->attr[0]), *p = o->data;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) p[i] = h;
        return;
    }
    KCHECK(o->dtype == KT_F32, "full: unsupported dtype %d", o->dtype);
    float v = (float)k->attr[0], *p = fdata(o);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) p[i] = v;
}
