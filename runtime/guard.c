/* runtime/guard.c: the debug guard (fsexec --debug-guard, ExecOptions.guard), which
 * proves at run time that every kernel stays inside the buffers the plan gave it.
 *
 * Before each op, every arena byte that belongs to no buffer live at that op (the gaps
 * between buffers, the padding after each, the buffers dead or not yet made) is filled
 * with a canary pattern, and every live buffer the op may not write gets a checksum per
 * CHUNK bytes. After the op, the canaries and the checksums must be as they were. An op
 * may write the buffers of its outputs; an effect op (OPF_EFFECT: adamw, sgd), which has
 * none, the persistent state (params, optimizer state, master weights, KV caches) among its inputs.
 * A buffer is a root tensor (alias == PLAN_NONE): a view lies inside its root. A guard
 * watches one memory space's arena (the executor makes one per space: offload's host
 * space is guarded like the device's).
 *
 * Buffers that no op makes (params, inputs, state, constants made at setup) are held
 * live over the whole step: nothing could make them again.
 *
 * The cost is a pass over the arena per op; a debug mode, for tests and for suspicion.
 * Everything is allocated in rt_guard_new; nothing in the step.
 */
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "report.h"
#include "runtime.h"

enum { CHUNK = 256, PATTERN = 4096 };

/* The canary, by arena offset mod 4: 0xFFC0BEEF little-endian, a NaN as f32. */
static const uint8_t CANARY[4] = {0xEF, 0xBE, 0xC0, 0xFF};

struct Guard {
    const Plan *plan;
    PlanPlace space;         // the memory space whose arena this is
    uint8_t *arena;
    int64_t arena_bytes;
    int32_t *roots;          // root tensor ids by offset
    int32_t n_roots;
    int32_t *chunk_at;       // [n_tensors] first checksum slot of each root
    uint64_t *sums;          // checksums, CHUNK bytes each
    int32_t *live;           // roots live at the current op, by offset
    int32_t n_live;
    uint8_t *writes;         // [n_tensors] 1: the current op may write this root
    uint8_t pattern[PATTERN + 4];
};

static int32_t root_of(const Plan *p, int32_t t) { return p->tensors[t].alias == PLAN_NONE ? t : p->tensors[t].alias; }

static int64_t nbytes(const Guard *g, int32_t t) { return plan_tensor_nbytes(&g->plan->tensors[t]); }

typedef struct {
    int64_t offset;
    int32_t id;
} Slot;

static int by_offset(const void *a, const void *b)
{
    const Slot *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int sort_roots(Guard *g)
{
    Slot *s = plan_alloc(sizeof *s * ((size_t)g->n_roots + 1));
    if (!s) return -1;
    for (int32_t i = 0; i < g->n_roots; i++) s[i] = (Slot){g->plan->tensors[g->roots[i]].offset, g->roots[i]};
    qsort(s, (size_t)g->n_roots, sizeof *s, by_offset);
    for (int32_t i = 0; i < g->n_roots; i++) g->roots[i] = s[i].id;
    plan_dealloc(s);
    return 0;
}

Guard *rt_guard_new(const Plan *p, PlanPlace space, uint8_t *arena, int64_t arena_bytes, char *err, size_t errlen)
{
    Guard *g = plan_alloc(sizeof *g);
    if (!g) {
        plan_fail(err, errlen, "out of memory");
        return NULL;
    }
    memset(g, 0, sizeof *g);
    g->plan = p, g->space = space, g->arena = arena, g->arena_bytes = arena_bytes;
    size_t nt = (size_t)p->n_tensors + 1;
    g->roots = plan_alloc(sizeof *g->roots * nt);
    g->live = plan_alloc(sizeof *g->live * nt);
    g->chunk_at = plan_alloc(sizeof *g->chunk_at * nt);
    g->writes = plan_alloc(nt);
    int64_t chunks = 0;
    for (int32_t t = 0; t < p->n_tensors; t++)
        if (p->tensors[t].alias == PLAN_NONE) chunks += (plan_tensor_nbytes(&p->tensors[t]) + CHUNK - 1) / CHUNK;
    g->sums = plan_alloc(sizeof *g->sums * (size_t)(chunks + 1));
    if (!g->roots || !g->live || !g->chunk_at || !g->writes || !g->sums) {
        rt_guard_free(g);
        plan_fail(err, errlen, "out of memory for the guard's checksums");
        return NULL;
    }
    memset(g->writes, 0, nt);
    int32_t slot = 0;
    for (int32_t t = 0; t < p->n_tensors; t++) {
        if (p->tensors[t].alias != PLAN_NONE || p->tensors[t].place != space) continue;
        g->roots[g->n_roots++] = t;
        g->chunk_at[t] = slot;
        slot += (int32_t)((plan_tensor_nbytes(&p->tensors[t]) + CHUNK - 1) / CHUNK);
    }
    if (sort_roots(g)) {
        rt_guard_free(g);
        plan_fail(err, errlen, "out of memory");
        return NULL;
    }
    for (int i = 0; i < PATTERN + 4; i++) g->pattern[i] = CANARY[i % 4];
    return g;
}

void rt_guard_free(Guard *g)
{
    if (!g) return;
    plan_dealloc(g->roots);
    plan_dealloc(g->live);
    plan_dealloc(g->chunk_at);
    plan_dealloc(g->writes);
    plan_dealloc(g->sums);
    plan_dealloc(g);
}

static int live_at(const PlanTensor *t, int32_t op)
{
    return t->producer == PLAN_NONE || (t->live_start <= op && op <= t->live_end);
}

static uint64_t checksum(const uint8_t *b, int64_t n)
{
    uint64_t h = 0xcbf29ce484222325ull, w;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) memcpy(&w, b + i, 8), h = (h ^ w) * 0x100000001b3ull, h ^= h >> 29;
    for (; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* The roots op k may write: its outputs', or an effect op's persistent inputs'. */
static void mark_writes(Guard *g, int32_t k, uint8_t on)
{
    const Plan *p = g->plan;
    const PlanOp *op = &p->ops[k];
    for (int32_t i = 0; i < op->n_out; i++) g->writes[root_of(p, p->ids[op->out + i])] = on;
    OpKind kind = op_lookup(plan_str(p, op->op));
    if (kind == OP_COUNT || !(op_info(kind)->flags & OPF_EFFECT)) return;
    for (int32_t i = 0; i < op->n_in; i++) {
        int32_t r = root_of(p, p->ids[op->in + i]);
        PlanRole role = p->tensors[r].role;
        if (role == PLAN_ROLE_PARAM || role == PLAN_ROLE_OPT_STATE || role == PLAN_ROLE_MASTER ||
            role == PLAN_ROLE_KV_CACHE || role == PLAN_ROLE_PARAM16)
            g->writes[r] = on;
    }
}

/* Calls fn on every free range [a, b) of the arena at the current op. */
static int each_gap(Guard *g, int (*fn)(Guard *, int64_t, int64_t, int32_t, void *), void *ctx)
{
    int64_t at = 0;
    int32_t below = PLAN_NONE;
    for (int32_t i = 0; i <= g->n_live; i++) {
        int32_t t = i < g->n_live ? g->live[i] : PLAN_NONE;
        int64_t start = t == PLAN_NONE ? g->arena_bytes : g->plan->tensors[t].offset;
        if (start > at && fn(g, at, start, below, ctx)) return -1;
        if (t == PLAN_NONE) break;
        int64_t end = start + nbytes(g, t);
        if (end > at) at = end, below = t;
    }
    return 0;
}

static int fill(Guard *g, int64_t a, int64_t b, int32_t below, void *ctx)
{
    (void)below, (void)ctx;
    for (int64_t at = a; at < b;) {
        int64_t n = b - at < PATTERN ? b - at : PATTERN;
        memcpy(g->arena + at, g->pattern + at % 4, (size_t)n);
        at += n;
    }
    return 0;
}

void rt_guard_before(Guard *g, int32_t k)
{
    const Plan *p = g->plan;
    g->n_live = 0;
    for (int32_t i = 0; i < g->n_roots; i++)
        if (live_at(&p->tensors[g->roots[i]], k)) g->live[g->n_live++] = g->roots[i];
    each_gap(g, fill, NULL);
    mark_writes(g, k, 1);
    for (int32_t i = 0; i < g->n_live; i++) {
        int32_t t = g->live[i];
        if (g->writes[t]) continue;
        const uint8_t *b = g->arena + p->tensors[t].offset;
        int64_t n = nbytes(g, t);
        for (int64_t c = 0; c * CHUNK < n; c++)
            g->sums[g->chunk_at[t] + c] = checksum(b + c * CHUNK, n - c * CHUNK < CHUNK ? n - c * CHUNK : CHUNK);
    }
}

typedef struct {
    int32_t op;
    char *err;
    size_t errlen;
} Check;

static const char *where(const Guard *g, int32_t k, char *buf, size_t n) { return report_op_where(g->plan, k, buf, n); }

/* A gap whose canary changed: the first and last damaged bytes, and what lies below. */
static int check_gap(Guard *g, int64_t a, int64_t b, int32_t below, void *ctx)
{
    Check *c = ctx;
    int64_t first = -1, last = -1;
    for (int64_t at = a; at < b;) {
        int64_t n = b - at < PATTERN ? b - at : PATTERN;
        if (memcmp(g->arena + at, g->pattern + at % 4, (size_t)n)) {
            for (int64_t i = at; i < at + n; i++)
                if (g->arena[i] != CANARY[i % 4]) last = i, first = first < 0 ? i : first;
        }
        at += n;
    }
    if (first < 0) return 0;
    char w[256], name[64], type[96];
    const Plan *p = g->plan;
    char after[256] = "at the start of the arena";
    if (below != PLAN_NONE)
        snprintf(after, sizeof after, "after the end of tensor %s (%s, bytes [%lld, %lld)%s)",
                 report_tensor_name(p, below, name, sizeof name), report_type(&p->tensors[below], type, sizeof type),
                 (long long)p->tensors[below].offset, (long long)(p->tensors[below].offset + nbytes(g, below)),
                 g->writes[below] ? ", an output of this op" : "");
    return plan_fail(c->err, c->errlen, "guard: op %d, %s, wrote outside its planned buffers: %s arena bytes [%lld, "
                   "%lld) changed, in free space [%lld, %lld) %s", c->op, where(g, c->op, w, sizeof w),
                   plan_place_name(g->space), (long long)first,
                   (long long)last + 1, (long long)a, (long long)b, after);
}

/* A live buffer the op may not write, whose checksum changed. */
static int check_live(Guard *g, int32_t t, Check *c)
{
    const Plan *p = g->plan;
    const uint8_t *b = g->arena + p->tensors[t].offset;
    int64_t n = nbytes(g, t), first = -1, last = -1;
    for (int64_t k = 0; k * CHUNK < n; k++) {
        int64_t len = n - k * CHUNK < CHUNK ? n - k * CHUNK : CHUNK;
        if (checksum(b + k * CHUNK, len) != g->sums[g->chunk_at[t] + k])
            last = k * CHUNK + len, first = first < 0 ? k * CHUNK : first;
    }
    if (first < 0) return 0;
    char w[256], name[64], type[96];
    int64_t at = p->tensors[t].offset;
    return plan_fail(c->err, c->errlen, "guard: op %d, %s, wrote outside its planned buffers: %s arena bytes [%lld, "
                   "%lld) changed, inside tensor %s (%s, %s, bytes [%lld, %lld)), live here and not written by this op",
                   c->op, where(g, c->op, w, sizeof w), plan_place_name(g->space), (long long)(at + first),
                   (long long)(at + last),
                   report_tensor_name(p, t, name, sizeof name), report_type(&p->tensors[t], type, sizeof type),
                   plan_role_name(p->tensors[t].role), (long long)at, (long long)(at + n));
}

int rt_guard_after(Guard *g, int32_t k, char *err, size_t errlen)
{
    Check c = {k, err, errlen};
    int rc = each_gap(g, check_gap, &c);
    for (int32_t i = 0; i < g->n_live && !rc; i++)
        if (!g->writes[g->live[i]]) rc = check_live(g, g->live[i], &c);
    mark_writes(g, k, 0);
    return rc;
}
