/* runtime/cpu/norm.c: layernorm and rmsnorm over the last dim, and their backward ops.
 *
 * x is (rows, C). The forward kernels work row by row (statistics in two passes over a
 * row that sits in L1: mean, then the centred sum of squares, as PyTorch's biased
 * variance). The backward kernels need per-row statistics for dx and column sums over
 * all rows for dw (and db); with no scratch to keep per-row state, they run in three
 * parallel passes that use dx itself as scratch:
 *   1. rows:    dx = xhat
 *   2. columns: dw = sum_r dy * xhat, db = sum_r dy   (each column in row order)
 *   3. rows:    dx from xhat, dy, w and the recomputed rstd
 * Every sum runs in a fixed order, so results do not depend on the thread count.
 * dx must not share a buffer with x or dy.
 *
 * In 16 bits the forward kernels run as f32 calls on staged rows (lowp.c). The
 * backward stages blocks of rows of x and dy in the workspace, with dx's scratch and
 * f32 accumulators for dw and db that carry over from block to block: every column
 * still sums its rows in order, so the result is the f32 kernel's, rounded once.
 *
 * The _add forms (passes/epilogue.c: a residual stream's gradient) add r to dx in f32
 * after dx is computed, then round once: in f32, r + dx as the add they replace.
 */
#include <math.h>
#include <string.h>

#include "cpu_impl.h"

static void ln_stats(const float *x, int64_t C, float eps, float *mean, float *rstd)
{
    float m = vsum(x, C) / (float)C;
    *mean = m;
    *rstd = 1.0f / sqrtf(vsqdev(x, m, C) / (float)C + eps);
}

static float rms_rstd(const float *x, int64_t C, float eps) { return 1.0f / sqrtf(vdot(x, x, C) / (float)C + eps); }

static int64_t rows_of(const KTensor *x) { return x->numel / x->shape[x->rank - 1]; }

static const Slabs LAYERNORM = {{1, SLAB_WHOLE, SLAB_WHOLE, 1}, -1};  // x, w, b -> y: by rows
static const Slabs RMSNORM = {{1, SLAB_WHOLE, 1}, -1};

CpuWork cpu_work_layernorm(const KCall *k) { return slab_work(k, &LAYERNORM); }
CpuWork cpu_work_rmsnorm(const KCall *k) { return slab_work(k, &RMSNORM); }

void cpu_layernorm(const KCall *k)
{
    const KTensor *X = &k->in[0];
    if (lowp_call(k)) {
        slab_run(k, &LAYERNORM, cpu_layernorm);
        return;
    }
    KCHECK(X->dtype == KT_F32, "layernorm: unsupported dtype %d", X->dtype);
    int64_t C = X->shape[X->rank - 1], rows = rows_of(X);
    const float *x = fdata(X), *w = fdata(&k->in[1]), *b = fdata(&k->in[2]);
    float *y = fdata(&k->out[0]), eps = (float)k->attr[3];
#pragma omp parallel for if (X->numel > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * C;
        float *yr = y + r * C, m, s;
        ln_stats(xr, C, eps, &m, &s);
        VEC_LOOP
        for (int64_t c = 0; c < C; c++) yr[c] = (xr[c] - m) * s * w[c] + b[c];
    }
}

void cpu_rmsnorm(const KCall *k)
{
    const KTensor *X = &k->in[0];
    if (lowp_call(k)) {
        slab_run(k, &RMSNORM, cpu_rmsnorm);
        return;
    }
    KCHECK(X->dtype == KT_F32, "rmsnorm: unsupported dtype %d", X->dtype);
    int64_t C = X->shape[X->rank - 1], rows = rows_of(X);
    const float *x = fdata(X), *w = fdata(&k->in[1]);
    float *y = fdata(&k->out[0]), eps = (float)k->attr[2];
#pragma omp parallel for if (X->numel > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * C;
        float *yr = y + r * C, s = rms_rstd(xr, C, eps);
        VEC_LOOP
        for (int64_t c = 0; c < C; c++) yr[c] = xr[c] * s * w[c];
    }
}

/* Pass 2: dw[c] = sum_r dy[r, c] * xhat[r, c] and, when db, db[c] = sum_r dy[r, c];
 * the sums start from 0 when fresh, else from dw and db. */
static void column_sums(const float *dy, const float *xhat, int64_t rows, int64_t C, float *dw, float *db, int fresh)
{
    int64_t ch = col_chunk(1, C), nch = (C + ch - 1) / ch;
#pragma omp parallel for if (rows * C > PAR_MIN) schedule(static)
    for (int64_t t = 0; t < nch; t++) {
        int64_t c0 = t * ch, len = imin(ch, C - c0);
        float *gw = dw + c0, *gb = db ? db + c0 : NULL;
        if (fresh) memset(gw, 0, sizeof(float) * (size_t)len);
        if (gb && fresh) memset(gb, 0, sizeof(float) * (size_t)len);
        for (int64_t r = 0; r < rows; r++) {
            const float *g = dy + r * C + c0, *h = xhat + r * C + c0;
            VEC_LOOP
            for (int64_t c = 0; c < len; c++) gw[c] += g[c] * h[c];
            if (gb) {
                VEC_LOOP
                for (int64_t c = 0; c < len; c++) gb[c] += g[c];
            }
        }
    }
}

/* Pass 3, one row: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w; dx
 * holds xhat on entry. rms drops the mean(g) term. */
static void dx_row(const float *dy, const float *w, float *dx, int64_t C, float rstd, int rms)
{
    float sg[LANES] = {0}, sgx[LANES] = {0}, a = 0, b = 0;
    int64_t c = 0;
    for (; c + LANES <= C; c += LANES)
        for (int j = 0; j < LANES; j++) {
            float g = dy[c + j] * w[c + j];
            sg[j] += g, sgx[j] += g * dx[c + j];
        }
    for (; c < C; c++) a += dy[c] * w[c], b += dy[c] * w[c] * dx[c];
    for (int j = 0; j < LANES; j++) a += sg[j], b += sgx[j];
    a = rms ? 0.0f : a / (float)C, b /= (float)C;
    VEC_LOOP
    for (c = 0; c < C; c++) dx[c] = rstd * (dy[c] * w[c] - a - dx[c] * b);
}

/* The three passes over rows of f32 x and dy: dx, and dw (db unless NULL) summed on
 * from where they are unless fresh. */
static void bwd_rows(const float *x, const float *w, const float *dy, float *dx, float *dw, float *db, int64_t rows,
                     int64_t C, float eps, int rms, int fresh)
{
#pragma omp parallel for if (rows * C > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * C;
        float *h = dx + r * C, m = 0, s;
        if (rms) s = rms_rstd(xr, C, eps);
        else ln_stats(xr, C, eps, &m, &s);
        VEC_LOOP
        for (int64_t c = 0; c < C; c++) h[c] = (xr[c] - m) * s;
    }
    column_sums(dy, dx, rows, C, dw, db, fresh);
#pragma omp parallel for if (rows * C > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * C;
        float m, s;
        if (rms) s = rms_rstd(xr, C, eps);
        else ln_stats(xr, C, eps, &m, &s);
        dx_row(dy + r * C, w, dx + r * C, C, s, rms);
    }
}

/* dx += r over n values: r + dx, the add the _add forms replace (f32 addition commutes). */
static void add_rows(float *dx, const float *r, int64_t n)
{
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) dx[i] = r[i] + dx[i];
}

/* Workspace: w, dw and db as f32, and x, dy and dx for each row of a block. */
CpuWork cpu_work_norm_bwd(const KCall *k)
{
    if (!lowp_call(k)) return (CpuWork){0, 0};
    const KTensor *X = &k->in[0];
    size_t C = (size_t)X->shape[X->rank - 1];
    return (CpuWork){6 * C, 3 * C + 3 * C * (size_t)rows_of(X)};
}

static void norm_bwd_lowp(const KCall *k, int rms)
{
    const KTensor *X = &k->in[0], *W = &k->in[1], *DY = &k->in[2];
    int64_t C = X->shape[X->rank - 1], rows = rows_of(X);
    size_t least = cpu_work_norm_bwd(k).least;
    KCHECK(k->work && k->work_floats >= least, "%s_bwd: a 16-bit call needs a workspace of %zu floats, has %zu",
           rms ? "rmsnorm" : "layernorm", least, k->work ? k->work_floats : 0);
    int64_t block = imin(rows, (int64_t)((k->work_floats - 3 * (size_t)C) / (3 * (size_t)C)));
    float *w = k->work, *dw = w + C, *db = rms ? NULL : dw + C, *x = dw + 2 * C, *dy = x + block * C, *dx = dy + block * C;
    float eps = (float)k->attr[k->n_in];
    to_f32(w, W->data, W->dtype, 0, C);
    for (int64_t r0 = 0; r0 < rows; r0 += block) {
        int64_t n = imin(block, rows - r0);
        to_f32_par(x, X->data, X->dtype, r0 * C, n * C);
        to_f32_par(dy, DY->data, DY->dtype, r0 * C, n * C);
        bwd_rows(x, w, dy, dx, dw, db, n, C, eps, rms, r0 == 0);
        if (k->n_in == 4) {  // x's rows are done with: r's go there
            to_f32_par(x, k->in[3].data, k->in[3].dtype, r0 * C, n * C);
            add_rows(dx, x, n * C);
        }
        from_f32_par(k->out[0].data, k->out[0].dtype, r0 * C, dx, n * C);
    }
    from_f32(k->out[1].data, k->out[1].dtype, 0, dw, C);
    if (!rms) from_f32(k->out[2].data, k->out[2].dtype, 0, db, C);
}

static void norm_bwd(const KCall *k, int rms)
{
    const KTensor *X = &k->in[0];
    if (lowp_call(k)) {
        norm_bwd_lowp(k, rms);
        return;
    }
    KCHECK(X->dtype == KT_F32, "%s_bwd: unsupported dtype %d", rms ? "rmsnorm" : "layernorm", X->dtype);
    int64_t C = X->shape[X->rank - 1], rows = rows_of(X);
    const float *x = fdata(X), *w = fdata(&k->in[1]), *dy = fdata(&k->in[2]);
    float *dx = fdata(&k->out[0]), *dw = fdata(&k->out[1]), *db = rms ? NULL : fdata(&k->out[2]);
    bwd_rows(x, w, dy, dx, dw, db, rows, C, (float)k->attr[k->n_in], rms, 1);
    if (k->n_in == 4) add_rows(dx, fdata(&k->in[3]), rows * C);
}

void cpu_layernorm_bwd(const KCall *k) { norm_bwd(k, 0); }
void cpu_rmsnorm_bwd(const KCall *k) { norm_bwd(k, 1); }
void cpu_layernorm_bwd_add(const KCall *k) { norm_bwd(k, 0); }
void cpu_rmsnorm_bwd_add(const KCall *k) { norm_bwd(k, 1); }
