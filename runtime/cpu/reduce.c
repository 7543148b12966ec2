/* runtime/cpu/reduce.c: reductions: sum, mean, max, softmax and their backward ops
 * (max_bwd, softmax_bwd), sum_to (the adjoint of broadcasting), and the gradient norm's
 * sumsq_parts and sum_parts.
 *
 * One engine sums over any set of dims (sum_dims): unit dims are dropped and neighbours
 * of the same kind merged, leaving alternating kept and reduced groups. When the
 * innermost group is kept, each output row accumulates whole input rows, vectorized,
 * over the reduced index in increasing order; when it is reduced, each output element
 * sums its contiguous runs (in float lanes, the runs in double). Either way an element's sum runs in one fixed
 * order whatever the thread count: results are bitwise reproducible.
 *
 * Axis ops (max, softmax) view x as (outer, n, inner). inner == 1 works row by row;
 * otherwise a task takes a chunk of at most COLS inner columns and keeps per-column
 * state on the stack.
 *
 * In 16 bits the sums read their input as f32 in the same order (sum_dims keeps its
 * accumulators in a stack tile rather than in the output) and round once; the axis ops
 * are independent along outer, so they run as f32 calls on staged slabs (lowp.c).
 */
#include <math.h>
#include <string.h>

#include "cpu_impl.h"
#include "ops.h"

#define COLS 256  // inner columns per task in the strided axis kernels

/* vsum (cpu_impl.h) of a 16-bit run: the same lanes, the same order. */
#define VSUM_AS(fname, LD)                                                               \
    static float fname(const uint16_t *x, int64_t n)                                     \
    {                                                                                    \
        float a[LANES] = {0}, s = 0;                                                     \
        int64_t i = 0;                                                                   \
        for (; i + LANES <= n; i += LANES)                                               \
            for (int j = 0; j < LANES; j++) a[j] += LD(x[i + j]);                        \
        for (; i < n; i++) s += LD(x[i]);                                                \
        for (int j = 0; j < LANES; j++) s += a[j];                                       \
        return s;                                                                        \
    }
VSUM_AS(vsum_f16, ld_f16)
VSUM_AS(vsum_bf16, ld_bf16)

/* One output row chunk of the innermost-kept case: acc (len) = sum over q of x rows. */
static void sum_rows_f32(const float *xr, int nr, const int64_t *rsz, const int64_t *rst, int64_t nred, float *acc,
                         int64_t len, float scale)
{
    memset(acc, 0, sizeof(float) * (size_t)len);
    for (int64_t q = 0; q < nred; q++) {
        const float *xq = xr + offset_of(q, nr, rsz, rst);
        VEC_LOOP
        for (int64_t i = 0; i < len; i++) acc[i] += xq[i];
    }
    if (scale != 1.0f) {
        VEC_LOOP
        for (int64_t i = 0; i < len; i++) acc[i] *= scale;
    }
}

/* out = scale * (x summed over the dims d with red[d]); out holds the kept dims. */
static void sum_dims(const KTensor *X, const int *red, const KTensor *O, float scale)
{
    int rank = X->rank, dt = X->dtype, lp = lowp(dt);
    const int64_t *shape = X->shape;
    const float *x = fdata(X);
    const uint16_t *xh = X->data;
    float *out = fdata(O);
    KCHECK(dt != KT_I32 && O->dtype == dt, "sum: unsupported dtypes %d -> %d", dt, O->dtype);
    int64_t sz[K_MAX_RANK], st[K_MAX_RANK];
    int mk[K_MAX_RANK], g = 0;
    for (int d = 0; d < rank; d++) {
        if (shape[d] == 1) continue;
        if (g > 0 && mk[g - 1] == (red[d] != 0)) sz[g - 1] *= shape[d];
        else sz[g] = shape[d], mk[g] = red[d] != 0, g++;
    }
    if (g == 0) {
        float v = kload(X, 0) * scale;
        if (lp) from_f32(O->data, dt, 0, &v, 1);
        else out[0] = v;
        return;
    }
    st[g - 1] = 1;
    for (int d = g - 2; d >= 0; d--) st[d] = st[d + 1] * sz[d + 1];
    int64_t ksz[K_MAX_RANK], kst[K_MAX_RANK], rsz[K_MAX_RANK], rst[K_MAX_RANK], nout = 1, nred = 1, total = 1;
    int nk = 0, nr = 0;
    for (int d = 0; d < g; d++) {
        total *= sz[d];
        if (mk[d]) rsz[nr] = sz[d], rst[nr++] = st[d], nred *= sz[d];
        else ksz[nk] = sz[d], kst[nk++] = st[d], nout *= sz[d];
    }
    if (!mk[g - 1]) {  // innermost kept: add whole rows
        int64_t inner = sz[g - 1], rows = nout / inner, ch = col_chunk(rows, inner), nch = (inner + ch - 1) / ch;
#pragma omp parallel for if (total > PAR_MIN) schedule(static)
        for (int64_t t = 0; t < rows * nch; t++) {
            int64_t r = t / nch, c0 = (t % nch) * ch, len = imin(ch, inner - c0), xr = offset_of(r, nk - 1, ksz, kst) + c0;
            if (!lp) {
                sum_rows_f32(x + xr, nr, rsz, rst, nred, out + r * inner + c0, len, scale);
                continue;
            }
            for (int64_t i0 = 0; i0 < len; i0 += COLS) {  // 16-bit: accumulate a stack tile, round it
                int64_t n = imin(COLS, len - i0);
                float acc[COLS] = {0};
                for (int64_t q = 0; q < nred; q++) add_to_f32(acc, xh, dt, xr + i0 + offset_of(q, nr, rsz, rst), n);
                if (scale != 1.0f)
                    for (int64_t i = 0; i < n; i++) acc[i] *= scale;
                from_f32(O->data, dt, r * inner + c0 + i0, acc, n);
            }
        }
    } else {  // innermost reduced: each output sums contiguous runs of m
        int64_t m = sz[g - 1], runs = nred / m;
#pragma omp parallel for if (total > PAR_MIN) schedule(static)
        for (int64_t e = 0; e < nout; e++) {
            int64_t xe = offset_of(e, nk, ksz, kst);
            double s = 0;
            for (int64_t q = 0; q < runs; q++) {
                int64_t at = xe + offset_of(q, nr - 1, rsz, rst);
                s += !lp ? vsum(x + at, m) : dt == KT_BF16 ? vsum_bf16(xh + at, m) : vsum_f16(xh + at, m);
            }
            float v = (float)(s * scale);
            if (lp) from_f32(O->data, dt, e, &v, 1);
            else out[e] = v;
        }
    }
}

static void reduce_axis_sum(const KCall *k, int mean)
{
    const KTensor *x = &k->in[0];
    int axis = norm_axis(k_int(k, 1), x->rank), red[K_MAX_RANK] = {0};
    red[axis] = 1;
    sum_dims(x, red, &k->out[0], mean ? 1.0f / (float)x->shape[axis] : 1.0f);
}

void cpu_sum(const KCall *k) { reduce_axis_sum(k, 0); }
void cpu_mean(const KCall *k) { reduce_axis_sum(k, 1); }

/* sum_to(x, shape): x summed down to the output's shape (rank <= x's, aligned right;
 * output dims of size 1 are summed too). */
void cpu_sum_to(const KCall *k)
{
    const KTensor *x = &k->in[0], *o = &k->out[0];
    int off = x->rank - o->rank, red[K_MAX_RANK] = {0};
    KCHECK(off >= 0, "sum_to: bad call (rank %d to %d)", x->rank, o->rank);
    for (int d = 0; d < x->rank; d++) {
        if (d < off) {
            red[d] = 1;
            continue;
        }
        int64_t want = o->shape[d - off];
        KCHECK(want == x->shape[d] || want == 1, "sum_to: dim %d: %lld does not reduce to %lld", d, (long long)x->shape[d],
               (long long)want);
        red[d] = want != x->shape[d];
    }
    sum_dims(x, red, o, 1.0f);
}

/* ---- max ---------------------------------------------------------------------------- */

/* x and the output (or x, dy and dx) by slabs from the axis (attribute 1, or 2). */
static const Slabs MAX = {{SLAB_AXIS, SLAB_AXIS}, 1};
static const Slabs MAX_BWD = {{SLAB_AXIS, SLAB_AXIS, SLAB_AXIS}, 2};

CpuWork cpu_work_max(const KCall *k) { return slab_work(k, &MAX); }
CpuWork cpu_work_max_bwd(const KCall *k) { return slab_work(k, &MAX_BWD); }

void cpu_max(const KCall *k)
{
    const KTensor *X = &k->in[0];
    if (lowp_call(k)) {
        slab_run(k, &MAX, cpu_max);
        return;
    }
    KCHECK(X->dtype == KT_F32, "max: unsupported dtype %d", X->dtype);
    int64_t outer, n, inner;
    around_axis(X, norm_axis(k_int(k, 1), X->rank), &outer, &n, &inner);
    const float *x = fdata(X);
    float *out = fdata(&k->out[0]);
    if (inner == 1) {
#pragma omp parallel for if (X->numel > PAR_MIN) schedule(static)
        for (int64_t o = 0; o < outer; o++) out[o] = row_max(x + o * n, n);
        return;
    }
    int64_t ch = col_chunk(outer, inner), nch = (inner + ch - 1) / ch;
#pragma omp parallel for if (X->numel > PAR_MIN) schedule(static)
    for (int64_t t = 0; t < outer * nch; t++) {
        int64_t o = t / nch, c0 = (t % nch) * ch, len = imin(ch, inner - c0);
        const float *xo = x + o * n * inner + c0;
        float *m = out + o * inner + c0;
        memcpy(m, xo, sizeof(float) * (size_t)len);
        for (int64_t j = 1; j < n; j++)
            VEC_LOOP
            for (int64_t i = 0; i < len; i++) m[i] = xo[j * inner + i] > m[i] ? xo[j * inner + i] : m[i];
    }
}

/* dx is dy at the first maximum along the axis, 0 elsewhere. dy has outer * inner
 * elements in the same order with or without keepdim. */
void cpu_max_bwd(const KCall *k)
{
    const KTensor *X = &k->in[0];
    if (lowp_call(k)) {
        slab_run(k, &MAX_BWD, cpu_max_bwd);
        return;
    }
    KCHECK(X->dtype == KT_F32, "max_bwd: unsupported dtype %d", X->dtype);
    int64_t outer, n, inner;
    around_axis(X, norm_axis(k_int(k, 2), X->rank), &outer, &n, &inner);
    const float *x = fdata(X), *dy = fdata(&k->in[1]);
    float *dx = fdata(&k->out[0]);
    int64_t ch = imin(COLS, col_chunk(outer, inner)), nch = (inner + ch - 1) / ch;
#pragma omp parallel for if (X->numel > PAR_MIN) schedule(static)
    for (int64_t t = 0; t < outer * nch; t++) {
        int64_t o = t / nch, c0 = (t % nch) * ch, len = imin(ch, inner - c0);
        const float *xo = x + o * n * inner + c0;
        float *dxo = dx + o * n * inner + c0;
        float best[COLS];
        int64_t arg[COLS];
        for (int64_t i = 0; i < len; i++) best[i] = xo[i], arg[i] = 0;
        for (int64_t j = 1; j < n; j++)
            for (int64_t i = 0; i < len; i++)
                if (xo[j * inner + i] > best[i]) best[i] = xo[j * inner + i], arg[i] = j;
        for (int64_t j = 0; j < n; j++) memset(dxo + j * inner, 0, sizeof(float) * (size_t)len);
        VEC_LOOP
        for (int64_t i = 0; i < len; i++) dxo[arg[i] * inner + i] = dy[o * inner + c0 + i];
    }
}

/* ---- softmax ------------------------------------------------------------------------ */

KSIMD static void softmax_row(const float *x, float *y, int64_t n)
{
    float m = row_max(x, n);
    VEC_LOOP
    for (int64_t j = 0; j < n; j++) y[j] = fexp(x[j] - m);
    float r = 1.0f / vsum(y, n);
    VEC_LOOP
    for (int64_t j = 0; j < n; j++) y[j] *= r;
}

/* Softmax down the columns c0..c0+len of one (n, inner) slab. */
KSIMD static void softmax_cols(const float *x, float *y, int64_t n, int64_t inner, int64_t len)
{
    float m[COLS], s[COLS];
    for (int64_t i = 0; i < len; i++) m[i] = -INFINITY, s[i] = 0;
    for (int64_t j = 0; j < n; j++)
        VEC_LOOP
        for (int64_t i = 0; i < len; i++) m[i] = x[j * inner + i] > m[i] ? x[j * inner + i] : m[i];
    for (int64_t j = 0; j < n; j++)
        VEC_LOOP
        for (int64_t i = 0; i < len; i++) {
            float e = fexp(x[j * inner + i] - m[i]);
            y[j * inner + i] = e;
            s[i] += e;
        }
    VEC_LOOP
    for (int64_t i = 0; i < len; i++) s[i] = 1.0f / s[i];
    for (int64_t j = 0; j < n; j++)
        VEC_LOOP
        for (int64_t i = 0; i < len; i++) y[j * inner + i] *= s[i];
}

static const Slabs SOFTMAX = {{SLAB_AXIS, SLAB_AXIS}, 1};
static const Slabs SOFTMAX_BWD = {{SLAB_AXIS, SLAB_AXIS, SLAB_AXIS}, 2};

CpuWork cpu_work_softmax(const KCall *k) { return slab_work(k, &SOFTMAX); }
CpuWork cpu_work_softmax_bwd(const KCall *k) { return slab_work(k, &SOFTMAX_BWD); }

void cpu_softmax(const KCall *k)
{
    const KTensor *X = &k->in[0];
    if (lowp_call(k)) {
        slab_run(k, &SOFTMAX, cpu_softmax);
        return;
    }
    KCHECK(X->dtype == KT_F32, "softmax: unsupported dtype %d", X->dtype);
    int64_t outer, n, inner;
    around_axis(X, norm_axis(k_int(k, 1), X->rank), &outer, &n, &inner);
    const float *x = fdata(X);
    float *y = fdata(&k->out[0]);
    if (inner == 1) {
#pragma omp parallel for if (X->numel > PAR_MIN) schedule(static)
        for (int64_t o = 0; o < outer; o++) softmax_row(x + o * n, y + o * n, n);
        return;
    }
    int64_t nch = (inner + COLS - 1) / COLS;
#pragma omp parallel for if (X->numel > PAR_MIN) schedule(static)
    for (int64_t t = 0; t < outer * nch; t++) {
        int64_t o = t / nch, c0 = (t % nch) * COLS;
        softmax_cols(x + o * n * inner + c0, y + o * n * inner + c0, n, inner, imin(COLS, inner - c0));
    }
}

/* dx = y * (dy - sum(dy * y, axis)) */
void cpu_softmax_bwd(const KCall *k)
{
    const KTensor *Y = &k->in[0];
    if (lowp_call(k)) {
        slab_run(k, &SOFTMAX_BWD, cpu_softmax_bwd);
        return;
    }
    KCHECK(Y->dtype == KT_F32, "softmax_bwd: unsupported dtype %d", Y->dtype);
    int64_t outer, n, inner;
    around_axis(Y, norm_axis(k_int(k, 2), Y->rank), &outer, &n, &inner);
    const float *y = fdata(Y), *dy = fdata(&k->in[1]);
    float *dx = fdata(&k->out[0]);
    int64_t nch = (inner + COLS - 1) / COLS;
#pragma omp parallel for if (Y->numel > PAR_MIN) schedule(static)
    for (int64_t t = 0; t < outer * nch; t++) {
        int64_t o = t / nch, c0 = (t % nch) * COLS, len = imin(COLS, inner - c0), base = o * n * inner + c0;
        const float *yo = y + base, *go = dy + base;
        float *dxo = dx + base;
        if (inner == 1) {
            float sf = vdot(yo, go, n);
            VEC_LOOP
            for (int64_t j = 0; j < n; j++) dxo[j] = yo[j] * (go[j] - sf);
            continue;
        }
        float s[COLS];
        for (int64_t i = 0; i < len; i++) s[i] = 0;
        for (int64_t j = 0; j < n; j++)
            VEC_LOOP
            for (int64_t i = 0; i < len; i++) s[i] += yo[j * inner + i] * go[j * inner + i];
        for (int64_t j = 0; j < n; j++)
            VEC_LOOP
            for (int64_t i = 0; i < len; i++) dxo[j * inner + i] = yo[j * inner + i] * (go[j * inner + i] - s[i]);
    }
}

/* ---- sumsq_parts, sum_parts ---------------------------------------------------------------------------- */

/* sum(x^2) in double, over 8 lanes so it vectorizes; x of storage S read through LD. */
#define DSUMSQ_AS(fname, S, LD)                                                          \
    KSIMD static double fname(const S *x, int64_t n)                                     \
    {                                                                                    \
        double a[8] = {0}, s = 0;                                                        \
        int64_t i = 0;                                                                   \
        for (; i + 8 <= n; i += 8)                                                       \
            for (int j = 0; j < 8; j++) a[j] += (double)LD(x[i + j]) * LD(x[i + j]);     \
        for (; i < n; i++) s += (double)LD(x[i]) * LD(x[i]);                             \
        for (int j = 0; j < 8; j++) s += a[j];                                           \
        return s;                                                                        \
    }
#define AS_IS(x) (x)
DSUMSQ_AS(dsumsq, float, AS_IS)
DSUMSQ_AS(dsumsq_f16, uint16_t, ld_f16)
DSUMSQ_AS(dsumsq_bf16, uint16_t, ld_bf16)

static void sumsq_check(const KCall *k)
{
    KCHECK(k->in[0].dtype != KT_I32 && k->out[0].dtype == KT_F32, "sumsq: unsupported dtypes %d -> %d",
           k->in[0].dtype, k->out[0].dtype);
}

/* sumsq_parts(x) -> f32 [chunks]: the sum of squares of each OPS_SUMSQ_CHUNK-element chunk
 * of x, in double (dsumsq's fixed lanes), rounded once; a chunk is one task, so the parts
 * do not depend on the thread count. */
void cpu_sumsq_parts(const KCall *k)
{
    sumsq_check(k);
    const KTensor *X = &k->in[0];
    int64_t n = X->numel, parts = k->out[0].numel;
    KCHECK(parts == (n > 0 ? (n + OPS_SUMSQ_CHUNK - 1) / OPS_SUMSQ_CHUNK : 1),
           "sumsq_parts: %lld parts for %lld elements", (long long)parts, (long long)n);
    float *out = fdata(&k->out[0]);
    const uint16_t *h = X->data;
    out[0] = 0;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t c = 0; c < (n + OPS_SUMSQ_CHUNK - 1) / OPS_SUMSQ_CHUNK; c++) {
        int64_t i0 = c * OPS_SUMSQ_CHUNK, len = imin(OPS_SUMSQ_CHUNK, n - i0);
        double s = X->dtype == KT_F32    ? dsumsq(fdata(X) + i0, len)
                   : X->dtype == KT_BF16 ? dsumsq_bf16(h + i0, len)
                                         : dsumsq_f16(h + i0, len);
        out[c] = (float)s;
    }
}

/* sum_parts(*xs f32) -> f32 []: every element of every input, in order, in double. */
void cpu_sum_parts(const KCall *k)
{
    double s = 0;
    for (int i = 0; i < k->n_in; i++) {
        KCHECK(k->in[i].dtype == KT_F32, "sum_parts: input %d has dtype %d, not f32", i, k->in[i].dtype);
        const float *x = fdata(&k->in[i]);
        for (int64_t j = 0; j < k->in[i].numel; j++) s += x[j];
    }
    fdata(&k->out[0])[0] = (float)s;
}
