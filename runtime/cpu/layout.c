/* runtime/cpu/layout.c: ops that move elements without arithmetic: reshape, transpose,
 * permute, heads, merge_heads (all one strided copy), split, concat, slice and slice_bwd.
 *
 * They work on any dtype by element size (4 bytes for f32 and i32, 2 for f16/bf16).
 * A permutation is planned once: unit dims dropped, output dims merged where x walks
 * them contiguously. If x's innermost dim stays innermost, the copy is a memcpy per row;
 * otherwise it is a tiled 2-D transpose between the output's innermost dim and the dim
 * that is innermost in x, so both sides stream through cache lines.
 *
 * split and concat find their axis from the shapes (the one dim that differs between
 * input and output), so they depend on no attribute; slice reads axis, start, len, and
 * its gradient slice_bwd axis and start (zeros around the rows it writes).
 * Outputs never share a buffer with inputs, except reshape, which may alias (a view).
 */
#include <string.h>

#include "cpu_impl.h"

#define TILE 32

static void copy_rows(const char *x, char *out, int esz, int g, const int64_t *sz, const int64_t *xs)
{
    int64_t inner = sz[g - 1], rows = 1;
    for (int d = 0; d < g - 1; d++) rows *= sz[d];
    size_t row_bytes = (size_t)(inner * esz);
#pragma omp parallel for if (rows * inner > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) memcpy(out + r * inner * esz, x + offset_of(r, g - 1, sz, xs) * esz, row_bytes);
}

#define TILE_COPY(T)                                                                     \
    for (int64_t i = i0; i < i1; i++)                                                    \
        for (int64_t j = j0; j < j1; j++)                                                \
            ((T *)out)[ob + i * ops + j] = ((const T *)x)[xb + i + j * xsl];

/* Output dims (sz, x strides xs) where x's contiguous dim p is not the last one. */
static void copy_tiled(const char *x, char *out, int esz, int g, const int64_t *sz, const int64_t *xs, int p)
{
    int64_t ost[K_MAX_RANK], osz[K_MAX_RANK], oxs[K_MAX_RANK], oos[K_MAX_RANK];
    ost[g - 1] = 1;
    for (int d = g - 2; d >= 0; d--) ost[d] = ost[d + 1] * sz[d + 1];
    int no = 0;
    int64_t nother = 1;
    for (int d = 0; d < g - 1; d++)
        if (d != p) osz[no] = sz[d], oxs[no] = xs[d], oos[no++] = ost[d], nother *= sz[d];
    int64_t P = sz[p], L = sz[g - 1], ops = ost[p], xsl = xs[g - 1];
    int64_t tp = (P + TILE - 1) / TILE, tl = (L + TILE - 1) / TILE;
#pragma omp parallel for if (nother * P * L > PAR_MIN) schedule(static)
    for (int64_t t = 0; t < nother * tp * tl; t++) {
        int64_t c = t / (tp * tl), i0 = (t / tl % tp) * TILE, j0 = t % tl * TILE;
        int64_t i1 = imin(P, i0 + TILE), j1 = imin(L, j0 + TILE);
        int64_t ob = offset_of(c, no, osz, oos), xb = offset_of(c, no, osz, oxs);
        if (esz == 4) TILE_COPY(uint32_t)
        else TILE_COPY(uint16_t)
    }
}

/* out dim i is x dim perm[i]. */
static void permute_copy(const void *x, void *out, int esz, int rank, const int64_t *xshape, const int *perm)
{
    int64_t xst[K_MAX_RANK + 1], sz[K_MAX_RANK + 1], xs[K_MAX_RANK + 1];
    int g = 0;
    xst[rank - 1] = 1;
    for (int d = rank - 2; d >= 0; d--) xst[d] = xst[d + 1] * xshape[d + 1];
    for (int i = 0; i < rank; i++) {
        int64_t n = xshape[perm[i]], s = xst[perm[i]];
        if (n == 1) continue;
        if (g > 0 && xs[g - 1] == s * n) sz[g - 1] *= n, xs[g - 1] = s;
        else sz[g] = n, xs[g++] = s;
    }
    if (g == 0) {
        memcpy(out, x, (size_t)esz);
        return;
    }
    if (xs[g - 1] == 1) {
        copy_rows(x, out, esz, g, sz, xs);
        return;
    }
    int p = 0;
    while (xs[p] != 1) p++;
    copy_tiled(x, out, esz, g, sz, xs, p);
}

static void swap_dims(const KTensor *x, void *out, int rank, const int64_t *shape, int a, int b)
{
    int perm[K_MAX_RANK + 1];
    for (int d = 0; d < rank; d++) perm[d] = d;
    perm[a] = b, perm[b] = a;
    permute_copy(x->data, out, esize(x->dtype), rank, shape, perm);
}

void cpu_reshape(const KCall *k)
{
    if (k->out[0].data != k->in[0].data)
        memmove(k->out[0].data, k->in[0].data, (size_t)(k->in[0].numel * esize(k->in[0].dtype)));
}

void cpu_transpose(const KCall *k)
{
    const KTensor *x = &k->in[0];
    swap_dims(x, k->out[0].data, x->rank, x->shape, norm_axis(k_int(k, 1), x->rank), norm_axis(k_int(k, 2), x->rank));
}

void cpu_permute(const KCall *k)
{
    const KTensor *x = &k->in[0];
    int perm[K_MAX_RANK];
    KCHECK(k->n_ints == x->rank, "permute: %d dims for rank %d", k->n_ints, x->rank);
    for (int i = 0; i < x->rank; i++) perm[i] = norm_axis((int)k->ints[i], x->rank);
    permute_copy(x->data, k->out[0].data, esize(x->dtype), x->rank, x->shape, perm);
}

/* [..., T, C] seen as [..., T, n, D], T and n swapped: [..., n, T, D]. */
void cpu_heads(const KCall *k)
{
    const KTensor *x = &k->in[0];
    int r = x->rank;
    int64_t n = k_int(k, 1), shape[K_MAX_RANK + 1];
    KCHECK(r >= 2 && n > 0 && x->shape[r - 1] % n == 0, "heads: bad call (rank %d, n %lld)", r, (long long)n);
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)r);
    shape[r - 1] = n, shape[r] = x->shape[r - 1] / n;
    swap_dims(x, k->out[0].data, r + 1, shape, r - 2, r - 1);
}

/* [..., n, T, D] -> [..., T, n, D], stored as [..., T, n * D]. */
void cpu_merge_heads(const KCall *k)
{
    const KTensor *x = &k->in[0];
    KCHECK(x->rank >= 3, "merge_heads: rank %d", x->rank);
    swap_dims(x, k->out[0].data, x->rank, x->shape, x->rank - 3, x->rank - 2);
}

/* The one dim where a and b differ (0 if none does). */
static int differing_dim(const KTensor *a, const KTensor *b)
{
    for (int d = 0; d < a->rank; d++)
        if (a->shape[d] != b->shape[d]) return d;
    return 0;
}

/* Copies, for each outer index, len*inner elements between x (axis length nx, from
 * position at) and y (axis length ny, from position yat). */
static void copy_slab(const char *x, int64_t nx, int64_t at, char *y, int64_t ny, int64_t yat, int64_t outer, int64_t len,
                      int64_t inner, int esz)
{
    size_t bytes = (size_t)(len * inner * esz);
#pragma omp parallel for if (outer * len * inner > PAR_MIN) schedule(static)
    for (int64_t o = 0; o < outer; o++)
        memcpy(y + ((o * ny + yat) * inner) * esz, x + ((o * nx + at) * inner) * esz, bytes);
}

void cpu_split(const KCall *k)
{
    const KTensor *x = &k->in[0];
    int axis = differing_dim(x, &k->out[0]), esz = esize(x->dtype);
    int64_t outer, n, inner, at = 0;
    around_axis(x, axis, &outer, &n, &inner);
    for (int t = 0; t < k->n_out; t++) {
        int64_t len = k->out[t].shape[axis];
        copy_slab(x->data, n, at, k->out[t].data, len, 0, outer, len, inner, esz);
        at += len;
    }
    KCHECK(at == n, "split: parts cover %lld of %lld", (long long)at, (long long)n);
}

void cpu_concat(const KCall *k)
{
    const KTensor *y = &k->out[0];
    int axis = differing_dim(y, &k->in[0]), esz = esize(y->dtype);
    int64_t outer, n, inner, at = 0;
    around_axis(y, axis, &outer, &n, &inner);
    for (int t = 0; t < k->n_in; t++) {
        int64_t len = k->in[t].shape[axis];
        copy_slab(k->in[t].data, len, 0, y->data, n, at, outer, len, inner, esz);
        at += len;
    }
    KCHECK(at == n, "concat: parts cover %lld of %lld", (long long)at, (long long)n);
}

/* slice(x, axis, start, len) */
void cpu_slice(const KCall *k)
{
    const KTensor *x = &k->in[0];
    int axis = norm_axis(k_int(k, 1), x->rank);
    int64_t outer, n, inner, start = k_int(k, 2), len = k_int(k, 3);
    around_axis(x, axis, &outer, &n, &inner);
    KCHECK(start >= 0 && len >= 0 && start + len <= n, "slice: [%lld, +%lld) out of %lld", (long long)start, (long long)len,
           (long long)n);
    copy_slab(x->data, n, start, k->out[0].data, len, 0, outer, len, inner, esize(x->dtype));
}

/* slice_view: its output lies in x's bytes where the slice's are, and the executor skips
 * it (exec.c); a plan that placed it elsewhere gets the slice's copy. */
void cpu_slice_view(const KCall *k) { cpu_slice(k); }

/* slice_bwd(dy, axis, start, size): zeros, then dy's rows at [start, start + len). */
void cpu_slice_bwd(const KCall *k)
{
    const KTensor *dy = &k->in[0], *y = &k->out[0];
    int axis = norm_axis(k_int(k, 1), y->rank), esz = esize(y->dtype);
    int64_t outer, n, inner, start = k_int(k, 2), len = dy->shape[axis];
    around_axis(y, axis, &outer, &n, &inner);
    KCHECK(start >= 0 && start + len <= n, "slice_bwd: [%lld, +%lld) out of %lld", (long long)start, (long long)len,
           (long long)n);
    memset(y->data, 0, (size_t)(outer * n * inner * esz));
    copy_slab(dy->data, len, 0, y->data, n, start, outer, len, inner, esz);
}

/* pad(x, axis, start, size): slice_bwd's copy (passes/pad_vocab.c's padded head). */
void cpu_pad(const KCall *k) { cpu_slice_bwd(k); }
