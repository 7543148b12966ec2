/* runtime/cpu/group.c: a fused group of elementwise calls (passes/fuse.c) run as one
 * parallel region, chunk by chunk.
 *
 * The calls' outputs all have one shape (the group's). The group's leading dims are cut
 * into chunks of whole rows; each thread takes a chunk and runs every member's kernel
 * on it, in the group's order, before the next chunk, so a member reads what the one
 * before it wrote while it is still in cache. Every member writes its whole output,
 * where the plan put it: only the order of the work changes, never a buffer or an
 * element's arithmetic (elementwise kernels compute each element alone), so the
 * results are bit for bit those of the members run one after the other.
 *
 * The cut: the first `split` dims of the group's shape, where every input is, on those
 * dims (right-aligned), either the group's size or broadcast (size 1 or absent). A
 * member's call on a chunk sees each full-size tensor as [rows of the chunk, the rest]
 * and each broadcast input without those dims. The member kernels run inside the
 * region, where OpenMP runs their own parallel loops on the calling thread alone.
 *
 * Buffers: the caller guarantees what memplan does for a fused group (every input of
 * a member lives to the group's end, so no member's output lies in its bytes).
 */
#include <string.h>

#include "cpu_impl.h"

#define GROUP_CHUNK 16384  // elements of the group's shape per chunk

/* The size of t's dim d when t is right-aligned to rank r (1 where t has none). */
static int64_t aligned_dim(const KTensor *t, int r, int d)
{
    int td = t->rank - (r - d);
    return td >= 0 ? t->shape[td] : 1;
}

/* Whether t is, over dims [0, s) of the group's shape `o`, the group's size (1) or
 * broadcast (0); -1 for a mix of both. */
static int full_over(const KTensor *t, const KTensor *o, int s)
{
    int full = 0, bcast = 0;
    for (int d = 0; d < s; d++) {
        if (o->shape[d] == 1) continue;
        int64_t a = aligned_dim(t, o->rank, d);
        full |= a == o->shape[d], bcast |= a == 1;
        if (a != 1 && a != o->shape[d]) return -1;
    }
    return full && bcast ? -1 : full;
}

int cpu_group_split(const KCall *const *k, int n)
{
    if (n < 1 || k[0]->n_out != 1) return 0;
    const KTensor *o = &k[0]->out[0];
    int best = 0;
    for (int s = 1; s <= o->rank; s++) {
        int ok = 1;
        for (int m = 0; m < n && ok; m++) {
            const KCall *c = k[m];
            ok = c->n_out == 1 && c->out[0].rank == o->rank && c->out[0].numel == o->numel;
            for (int d = 0; d < o->rank && ok; d++) ok = c->out[0].shape[d] == o->shape[d];
            for (int i = 0; i < c->n_in && ok; i++) ok = c->in[i].rank <= o->rank && full_over(&c->in[i], o, s) >= 0;
        }
        if (!ok) break;
        best = s;
    }
    return best;
}

/* t seen on rows [r0, r0 + nr) of the group's cut at `split` dims. */
static void chunk_of(const KTensor *t, const KTensor *o, int split, int64_t rows, int64_t r0, int64_t nr, KTensor *c)
{
    int r = o->rank, full = full_over(t, o, split) == 1;
    int64_t per = full ? t->numel / rows : 0;  // elements of t per row
    *c = *t;
    c->rank = r - split + full;
    int at = 0;
    if (full) c->shape[at++] = nr;
    for (int d = split; d < r; d++) c->shape[at++] = aligned_dim(t, r, d);
    c->numel = full ? nr * per : t->numel;
    c->data = (char *)t->data + r0 * per * esize(t->dtype);
}

void cpu_group_run(const CpuKernel *fn, const KCall *const *k, int n, int split)
{
    const KTensor *o = &k[0]->out[0];
    int64_t rows = 1;
    for (int d = 0; d < split; d++) rows *= o->shape[d];
    int64_t inner = o->numel / rows, step = imax(1, GROUP_CHUNK / imax(1, inner));
    int64_t chunks = (rows + step - 1) / step;
#pragma omp parallel for if (o->numel > PAR_MIN) schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t r0 = c * step, nr = imin(step, rows - r0);
        KCall sub;
        for (int m = 0; m < n; m++) {
            const KCall *x = k[m];
            sub = *x;
            for (int i = 0; i < x->n_in; i++) chunk_of(&x->in[i], o, split, rows, r0, nr, &sub.in[i]);
            chunk_of(&x->out[0], o, split, rows, r0, nr, &sub.out[0]);
            fn[m](&sub);
        }
    }
}
