/* runtime/batch.c: runs of a CPU rank's ops run as one parallel region each, so that
 * a step pays one OpenMP fork and join per run instead of one per op, and a fused
 * group's members share the cache.
 *
 * Two kinds, found once when the executor is made, from the plan as it is (its ops,
 * order and buffers unchanged: one plan for every backend):
 *   - GROUP: a fused group of elementwise ops as passes/fuse.c makes them (consecutive,
 *     one block, phase and space, one output shape, each member after the first reading
 *     an earlier member's output), run chunk by chunk (cpu/group.c);
 *   - ADAMW: consecutive adamw updates (one per flat unit; or adamw_cast), one loop over all their chunks.
 * (The gradient norm's sumsq_parts is one op per unit, parallel over its chunks within the
 * op: cpu/reduce.c.) Each is bit for bit its ops run one by one: the kernels compute every element (every
 * block of a sum) as the single calls do. That holds only while no op of a run writes
 * what another reads out of turn, which is checked here on the bytes the calls see,
 * not assumed from the passes: a run whose buffers could interfere stays op by op.
 *   GROUP: two members' tensors, one an output, overlap only as the very same bytes of
 *     the group's full shape (an output read by a later member, an update in place);
 *   ADAMW: the updated p, m and v (and adamw_cast's w) of every member are apart from each other and from
 *     every tensor any member reads.
 * A member after a run's first has no wait of its own (the schedule's waits are for
 * collectives; a run never spans one).
 */
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "ops.h"

enum { B_GROUP, B_ADAMW };

typedef struct {
    int kind;
    int32_t first, n;      // ops [first, first + n)
    int32_t pool;          // its calls in RtBatches.pool: every member, n of them
    int split;             // GROUP: the dims cut into chunks (cpu_group_split)
} Batch;

struct RtBatches {
    const KCall **call;  // per op, copied from rt_batches_new's
    CpuKernel *fn;
    int32_t *at;  // per op: the batch starting there, or -1
    Batch *list;
    int32_t n;
    const KCall **pool;
    CpuKernel *pool_fn;
    int32_t n_pool;
    int64_t *first;  // scratch for the largest batch: cpu_adamw_many's task counts
};

typedef struct {
    uintptr_t lo, hi;
} Span;

static Span span(const KTensor *t)
{
    uintptr_t lo = (uintptr_t)t->data;
    return (Span){lo, lo + (uintptr_t)t->numel * (t->dtype == KT_F16 || t->dtype == KT_BF16 ? 2u : 4u)};
}

static int overlap(Span a, Span b) { return a.lo < b.hi && b.lo < a.hi; }

static int by_lo(const void *a, const void *b)
{
    uintptr_t x = ((const Span *)a)->lo, y = ((const Span *)b)->lo;
    return (x > y) - (x < y);
}

/* Whether the writes w (sorted here) are apart from each other (with `own`) and from
 * every read r. */
static int apart(Span *w, int64_t nw, const Span *r, int64_t nr, int own)
{
    qsort(w, (size_t)nw, sizeof *w, by_lo);
    for (int64_t i = 1; i < nw && own; i++)
        if (w[i].lo < w[i - 1].hi) return 0;
    for (int64_t j = 0; j < nr; j++) {  // the last write starting before r's end must end before r starts
        int64_t lo = 0, hi = nw;
        while (lo < hi) {
            int64_t mid = (lo + hi) / 2;
            if (w[mid].lo < r[j].hi) lo = mid + 1;
            else hi = mid;
        }
        if (own && lo > 0 && overlap(w[lo - 1], r[j])) return 0;
        for (int64_t i = lo - 1; i >= 0 && !own; i--)  // writes that overlap each other: every one before
            if (overlap(w[i], r[j])) return 0;
    }
    return 1;
}

static const PlanOp *pop(const Plan *p, int32_t k) { return &p->ops[k]; }
static OpKind kind_of(const Plan *p, int32_t k) { return op_lookup(plan_str(p, p->ops[k].op)); }

static int elemwise(const Plan *p, int32_t k)
{
    OpKind o = kind_of(p, k);
    return o != OP_COUNT && (op_info(o)->flags & OPF_ELEMWISE) && p->ops[k].n_out == 1;
}

/* Whether op m joins the group of ops [first, m) (passes/fuse.c's rule). */
static int joins(const Plan *p, const KCall *const *call, int32_t first, int32_t m)
{
    const PlanOp *h = pop(p, first), *o = pop(p, m);
    if (!elemwise(p, m) || o->block != h->block || o->phase != h->phase || o->n_wait) return 0;
    if (p->tensors[p->ids[o->out]].place != p->tensors[p->ids[h->out]].place) return 0;
    const KTensor *a = &call[m]->out[0], *b = &call[first]->out[0];
    if (a->rank != b->rank || a->numel != b->numel) return 0;
    for (int d = 0; d < a->rank; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    for (int32_t i = 0; i < o->n_in; i++) {
        int32_t q = p->tensors[p->ids[o->in + i]].producer;
        if (q >= first && q < m) return 1;
    }
    return 0;
}

/* GROUP's rule on the bytes: overlaps only as the same full-shape bytes, an output involved. */
static int group_apart(const KCall *const *k, int n)
{
    int64_t full = k[0]->out[0].numel;
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++)
            for (int i = 0; i < k[a]->n_in + 1; i++)
                for (int j = 0; j < k[b]->n_in + 1; j++) {
                    const KTensor *x = i < k[a]->n_in ? &k[a]->in[i] : &k[a]->out[0];
                    const KTensor *y = j < k[b]->n_in ? &k[b]->in[j] : &k[b]->out[0];
                    if (i < k[a]->n_in && j < k[b]->n_in) continue;  // two reads
                    Span s = span(x), t = span(y);
                    if (overlap(s, t) && !(s.lo == t.lo && s.hi == t.hi && x->numel == full && y->numel == full))
                        return 0;
                }
    return 1;
}

static int adamw_apart(const KCall *const *k, int n, Span *w, Span *r)
{
    int64_t nw = 0, nr = 0;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < k[i]->n_in; j++) {
            if (j == 0 || j == 2 || j == 3 || j == 7) w[nw++] = span(&k[i]->in[j]);  // p, m, v, w
            else r[nr++] = span(&k[i]->in[j]);
        }
    }
    return apart(w, nw, r, nr, 1);
}

/* The batch that starts at op k, if any: its length (>= 2), its kind and split. */
static int32_t find(const RtBatches *b, const Plan *p, const unsigned char *may, int32_t k, Batch *out, Span *w,
                    Span *r)
{
    const KCall *const *call = (const KCall *const *)b->call;
    int32_t n = p->n_ops, end = k + 1;
    if (!may[k]) return 0;
    OpKind o = kind_of(p, k);
    if (o == OP_adamw || o == OP_adamw_cast) {
        while (end < n && may[end] && kind_of(p, end) == o && !pop(p, end)->n_wait &&
               pop(p, end)->phase == pop(p, k)->phase)
            end++;
        if (end - k < 2 || !adamw_apart(call + k, end - k, w, r)) return 0;
        *out = (Batch){.kind = B_ADAMW, .first = k, .n = end - k};
        return end - k;
    }
    if (!elemwise(p, k)) return 0;
    while (end < n && end - k < OPS_FUSE_MAX && may[end] && joins(p, call, k, end)) end++;  // fuse.c's groups
    int split = end - k >= 2 ? cpu_group_split(call + k, end - k) : 0;
    if (!split || !group_apart(call + k, end - k)) return 0;
    *out = (Batch){.kind = B_GROUP, .first = k, .n = end - k, .split = split};
    return end - k;
}

void rt_batches_free(RtBatches *b)
{
    if (!b) return;
    plan_dealloc(b->call), plan_dealloc(b->fn), plan_dealloc(b->at), plan_dealloc(b->list), plan_dealloc(b->pool), plan_dealloc(b->pool_fn);
    plan_dealloc(b->first);
    plan_dealloc(b);
}

RtBatches *rt_batches_new(const Plan *p, const KCall *const *call, const CpuKernel *fn, const unsigned char *may)
{
    size_t n = (size_t)p->n_ops + 1, most = 0;
    RtBatches *b = plan_alloc(sizeof *b);
    Span *w = plan_alloc(sizeof *w * K_MAX_TENSORS * n), *r = plan_alloc(sizeof *r * K_MAX_TENSORS * n);
    if (b) memset(b, 0, sizeof *b);
    if (!b || !w || !r || !(b->at = plan_alloc(sizeof *b->at * n)) || !(b->list = plan_alloc(sizeof *b->list * n)) ||
        !(b->pool = plan_alloc(sizeof *b->pool * n)) || !(b->pool_fn = plan_alloc(sizeof *b->pool_fn * n)) ||
        !(b->call = plan_alloc(sizeof *b->call * n)) || !(b->fn = plan_alloc(sizeof *b->fn * n)))
        goto none;
    memcpy(b->call, call, sizeof *call * (size_t)p->n_ops);
    memcpy(b->fn, fn, sizeof *fn * (size_t)p->n_ops);
    for (int32_t k = 0; k < p->n_ops; k++) b->at[k] = -1;
    for (int32_t k = 0; k < p->n_ops;) {
        Batch x;
        int32_t len = find(b, p, may, k, &x, w, r);
        if (!len) {
            k++;
            continue;
        }
        x.pool = b->n_pool;
        for (int32_t j = 0; j < x.n; j++) b->pool[x.pool + j] = call[k + j], b->pool_fn[x.pool + j] = fn[k + j];
        b->n_pool += x.n;
        most = (size_t)x.n > most ? (size_t)x.n : most;
        b->at[k] = b->n, b->list[b->n++] = x;
        k += len;
    }
    plan_dealloc(w), plan_dealloc(r);
    w = r = NULL;
    if (!b->n || !(b->first = plan_alloc(sizeof *b->first * (most + 1)))) goto none;
    return b;
none:
    plan_dealloc(w), plan_dealloc(r);
    rt_batches_free(b);
    return NULL;
}

int32_t rt_batch_len(const RtBatches *b, int32_t k) { return b->at[k] < 0 ? 0 : b->list[b->at[k]].n; }

void rt_batch_run(RtBatches *b, int32_t k)
{
    const Batch *x = &b->list[b->at[k]];
    const KCall *const *pool = (const KCall *const *)b->pool + x->pool;
    switch (x->kind) {
    case B_GROUP: cpu_group_run(b->pool_fn + x->pool, pool, x->n, x->split); break;
    case B_ADAMW: cpu_adamw_many(pool, x->n, b->first); break;
    }
}
