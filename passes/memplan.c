/* passes/memplan.c: static memory planning, one arena per memory space (device, host) of
 * each rank.
 *
 * Needs: the final node order and the schedule's waits (passes/schedule.c), every value
 *        typed, shaped and placed (Value.place: its space).
 * Gives: for every value an offset into its space's arena (Value.offset, 64-byte
 * aligned) and its live range [live_start, live_end] in node indices;
 * Graph.space_bytes, each arena's size. Each space is planned on its own.
 *
 * Params, optimizer state, master weights and inputs persist across steps: they sit at
 * the bottom of the arena, live over the whole step. Every other buffer lives from the
 * node that makes it to its last reader (the step's outputs: to the end of the step).
 * A view (OPF_VIEW: reshape, or a value the shard pass placed inside another: a param
 * inside its block's flat buffer, a rank's shard) lies in its root's buffer at a fixed
 * offset (plus a per-rank stride for shards); a root's range covers all its views.
 * Groups are placed one at a time, each at the lowest offset that no placed group with
 * an overlapping live range occupies, in two orders (largest first, and schedule order);
 * the smaller arena wins. Best fit packed no better on the samples; fixed orders keep
 * the plan deterministic.
 *
 * The members of a fused group (passes/fuse.c) read their inputs at the group's last
 * node, where its one CUDA kernel runs (ir_group_last).
 *
 * A collective runs on while the ops after it do: its input and output live until the
 * node the schedule has wait for it (to the step's end when none does), so no other
 * value's bytes overlap them while it is in flight, and no run-time check is needed.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

enum { ALIGN = 64 };

typedef struct {
    int root;                 // the value whose buffer this group is
    int64_t bytes, offset;
    int start, end;           // live range, node indices
    int persistent;
} Group;

static int64_t align_up(int64_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

static int persistent_role(Role r)
{
    return r == ROLE_PARAM || r == ROLE_OPT_STATE || r == ROLE_MASTER || r == ROLE_INPUT || r == ROLE_KV_CACHE ||
           r == ROLE_PARAM16;
}

/* Root of each value, and its byte offset and per-rank stride within the root. */
static void find_roots(const Graph *g, int *root, int64_t *at, int64_t *stride)
{
    for (int v = 0; v < g->n_values; v++) root[v] = -2;  // not resolved yet
    for (int v = 0; v < g->n_values; v++) {
        /* Walk up to a resolved ancestor or a root, then resolve the chain back down. */
        int chain[64], n = 0, u = v;
        while (root[u] == -2) {
            FS_ASSERT(n < 64);
            chain[n++] = u;
            int p = ir_view_parent(g, u);
            if (p < 0) {
                root[u] = u, at[u] = stride[u] = 0;
                n--;
                break;
            }
            u = p;
        }
        while (n-- > 0) {
            int w = chain[n], p = ir_view_parent(g, w);
            const Value *wv = ir_value(g, w);
            root[w] = root[p];
            at[w] = at[p] + wv->view_offset;
            stride[w] = stride[p] + wv->view_rank_stride;
        }
    }
}

/* Where node n reads its inputs: at n, or, in a fused group (passes/fuse.c), at the
 * group's last node, whose one kernel computes every member. So each input of a member
 * lives to the group's end, and no member's output is placed in its bytes. */
static void live_ranges(const Graph *g, const int *root, int *start, int *end)
{
    for (int v = 0; v < g->n_values; v++) {
        const Value *val = ir_value(g, v);
        start[v] = end[v] = val->producer >= 0 ? val->producer : 0;
    }
    for (int n = 0; n < g->n_nodes; n++) {  // ir_group_last(g, n) never decreases: the last write wins
        const Node *node = ir_node(g, n);
        for (int i = 0; i < node->n_in; i++) end[ir_in(g, node, i)] = ir_group_last(g, n);
    }
    for (int i = 0; i < g->n_outputs; i++) end[g->outputs[i]] = g->n_nodes;
    /* A buffer lives as long as anything inside it does. A view no node makes (a param
     * inside an all-gathered buffer) exists once its buffer does: it starts nothing. */
    for (int v = 0; v < g->n_values; v++) {
        int r = root[v];
        if (r == v) continue;
        if (ir_value(g, v)->producer >= 0 && start[v] < start[r]) start[r] = start[v];
        if (end[v] > end[r]) end[r] = end[v];
    }
}

static int by_size_desc(const void *a, const void *b)
{
    const Group *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
    if (x->start != y->start) return x->start - y->start;
    return x->root - y->root;
}

/* Lifetimes in schedule order, as a stack allocator would see them. */
static int by_start(const void *a, const void *b)
{
    const Group *x = a, *y = b;
    if (x->start != y->start) return x->start - y->start;
    return by_size_desc(a, b);
}

/* A placed group, as the first-fit walk reads it: its live range and its bytes. */
typedef struct {
    int start, end;
    int64_t offset, top;  // top: offset + its aligned bytes
} Slot;

/* Slots in offset order, in runs of at most RUN (an insert moves the tail of one run,
 * not of the whole list): every placed group, and per window of time the groups live in
 * it (a group within one window overlaps only those, so its walk reads only them). */
enum { WINDOWS = 64, RUN = 128 };

typedef struct {
    Slot slot[RUN];
    int n;
    int start, end;  // the earliest start and the latest end of its slots: a walk skips a
                     // run that lives wholly outside its group's range
} Run;

typedef struct {
    Run **run;
    int n, cap;
} Slots;

/* The lowest offset >= base where `grp` fits among the placed groups it overlaps; the
 * walk reads them in offset order and stops at the first overlapping group that starts
 * above the gap (the order of groups at one offset does not change the answer). */
static int64_t place(const Group *grp, const Slots *l, int64_t base)
{
    int64_t at = base;
    for (int r = 0; r < l->n; r++) {
        const Run *run = l->run[r];
        if (run->start > grp->end || grp->start > run->end) continue;
        for (int i = 0; i < run->n; i++) {
            const Slot *p = &run->slot[i];
            if (p->start > grp->end || grp->start > p->end) continue;
            if (p->offset >= at + grp->bytes) return at;
            if (p->top > at) at = p->top;
        }
    }
    return at;
}

static void run_span(Run *run)
{
    run->start = INT_MAX, run->end = INT_MIN;
    for (int i = 0; i < run->n; i++) {
        if (run->slot[i].start < run->start) run->start = run->slot[i].start;
        if (run->slot[i].end > run->end) run->end = run->slot[i].end;
    }
}

/* The index of the first of run's n slots above `offset`. */
static int above(const Slot *slot, int n, int64_t offset)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (slot[mid].offset > offset) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* A new empty run at index r of l's runs; NULL when out of memory. */
static Run *run_new(Slots *l, int r)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 8;
        Run **grown = realloc(l->run, sizeof *grown * (size_t)cap);
        if (!grown) return NULL;
        l->run = grown, l->cap = cap;
    }
    Run *fresh = malloc(sizeof *fresh);
    if (!fresh) return NULL;
    fresh->n = 0;
    fresh->start = INT_MAX, fresh->end = INT_MIN;
    memmove(l->run + r + 1, l->run + r, sizeof *l->run * (size_t)(l->n - r));
    l->run[r] = fresh;
    l->n++;
    return fresh;
}

/* Inserts s after every slot at or below its offset; -1 when out of memory. */
static int slots_insert(Slots *l, Slot s)
{
    if (!l->n && !run_new(l, 0)) return -1;
    int lo = 0, hi = l->n - 1;  // r: the first run whose last slot is above s, else the last
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (l->run[mid]->slot[l->run[mid]->n - 1].offset > s.offset) hi = mid;
        else lo = mid + 1;
    }
    int r = lo, at = above(l->run[r]->slot, l->run[r]->n, s.offset);
    if (l->run[r]->n == RUN) {  // split it in halves; s goes in the half that holds its place
        Run *second = run_new(l, r + 1);
        if (!second) return -1;
        Run *first = l->run[r];
        memcpy(second->slot, first->slot + RUN / 2, sizeof *first->slot * (RUN - RUN / 2));
        second->n = RUN - RUN / 2, first->n = RUN / 2;
        run_span(first), run_span(second);
        if (at > RUN / 2) r++, at -= RUN / 2;
    }
    Run *run = l->run[r];
    memmove(run->slot + at + 1, run->slot + at, sizeof *run->slot * (size_t)(run->n - at));
    run->slot[at] = s;
    run->n++;
    if (s.start < run->start) run->start = s.start;
    if (s.end > run->end) run->end = s.end;
    return 0;
}

static void slots_free(Slots *l)
{
    for (int r = 0; r < l->n; r++) free(l->run[r]);
    free(l->run);
}

/* Places every non-persistent group above base, first fit in `order`; returns the top. */
static int64_t place_all(Group *groups, int ng, int64_t base, int (*order)(const void *, const void *), int n_nodes)
{
    qsort(groups, (size_t)ng, sizeof *groups, order);
    int64_t top = base;
    int width = n_nodes / WINDOWS + 1;  // live ranges end at n_nodes at most
    Slots all = {0}, win[WINDOWS] = {{0}};
    for (int i = 0; i < ng; i++) {
        Group *grp = &groups[i];
        if (grp->persistent) continue;
        int w0 = grp->start / width, w1 = grp->end / width;
        grp->offset = place(grp, w0 == w1 ? &win[w0] : &all, base);
        Slot s = {grp->start, grp->end, grp->offset, grp->offset + align_up(grp->bytes)};
        int bad = slots_insert(&all, s);
        for (int w = w0; w <= w1; w++) bad |= slots_insert(&win[w], s);
        FS_ASSERT(!bad);  // out of memory
        if (s.top > top) top = s.top;
    }
    slots_free(&all);
    for (int w = 0; w < WINDOWS; w++) slots_free(&win[w]);
    return top;
}

/* No placement needs less than the most aligned bytes live at one node. */
static int64_t lower_bound(Arena *a, const Group *groups, int ng, int n_nodes)
{
    int64_t *diff = arena_alloc(a, sizeof(int64_t) * ((size_t)n_nodes + 2)), live = 0, most = 0;
    for (int i = 0; i < ng; i++) {
        diff[groups[i].start] += align_up(groups[i].bytes);
        diff[groups[i].end + 1] -= align_up(groups[i].bytes);
    }
    for (int n = 0; n <= n_nodes; n++) {
        live += diff[n];
        if (live > most) most = live;
    }
    return most;
}

/* The schedule's waits (passes/schedule.c): an op off the compute stream (a collective)
 * reads and writes its buffers until the node that waits for it, or the end of the step
 * when none does, so no buffer of it may be handed to another value before then. */
static void until_complete(const Graph *g, const int *root, int *end)
{
    char *waited = arena_alloc(g->arena, (size_t)g->n_nodes + 1);
    for (int w = 0; w < g->n_nodes; w++) {
        const Node *n = ir_node(g, w);
        for (int i = 0; i < n->n_wait; i++) {
            const Node *c = ir_node(g, g->waits[n->wait + i]);
            waited[g->waits[n->wait + i]] = 1;
            for (int k = 0; k < c->n_in + c->n_out; k++) {
                int r = root[k < c->n_in ? ir_in(g, c, k) : ir_out(g, c, k - c->n_in)];
                if (end[r] < w) end[r] = w;
            }
        }
    }
    for (int c = 0; c < g->n_nodes; c++) {
        const Node *n = ir_node(g, c);
        if (n->stream == STREAM_COMPUTE || waited[c]) continue;
        for (int k = 0; k < n->n_in + n->n_out; k++)
            end[root[k < n->n_in ? ir_in(g, n, k) : ir_out(g, n, k - n->n_in)]] = g->n_nodes;
    }
}

/* Plans the groups of one memory space (they are contiguous in `groups`); returns the
 * size of its arena. */
static int64_t plan_space(Graph *g, Group *groups, int ng)
{
    /* Persistent state first, in value order: the same layout whatever the activations. */
    int64_t top = 0;
    for (int i = 0; i < ng; i++)
        if (groups[i].persistent) groups[i].offset = top, top += align_up(groups[i].bytes);
    int64_t base = top;

    /* Largest first packs the transformers to the lower bound; schedule order packs
     * better where big buffers are short-lived (a small Llama: 2.0% above its peak
     * largest first, 0.01% in schedule order). */
    top = place_all(groups, ng, base, by_size_desc, g->n_nodes);
    if (top > lower_bound(g->arena, groups, ng, g->n_nodes)) {
        /* by_size_desc is a total order (roots are distinct): sorting again restores the
         * order these offsets were saved in. */
        int64_t by_size = top, *saved = arena_alloc(g->arena, sizeof *saved * (size_t)ng + 1);
        for (int i = 0; i < ng; i++) saved[i] = groups[i].offset;
        top = place_all(groups, ng, base, by_start, g->n_nodes);
        if (by_size <= top) {
            qsort(groups, (size_t)ng, sizeof *groups, by_size_desc);
            for (int i = 0; i < ng; i++) groups[i].offset = saved[i];
            top = by_size;
        }
    }
    return top;
}

int pass_memplan(Graph *g, const Options *o, Diag *d)
{
    (void)o, (void)d;
    int nv = g->n_values;
    int *root = arena_alloc(g->arena, sizeof(int) * (size_t)nv * 3 + 1);
    int *start = root + nv, *end = start + nv;
    int64_t *at = arena_alloc(g->arena, sizeof(int64_t) * (size_t)nv * 2 + 1), *stride = at + nv;
    find_roots(g, root, at, stride);
    live_ranges(g, root, start, end);
    until_complete(g, root, end);

    /* The groups of each space, space by space: each space is an arena of its own. */
    Group *groups = arena_alloc(g->arena, sizeof(Group) * (size_t)nv + 1);
    int ng = 0;
    for (int s = 0; s < PLACE_COUNT; s++) {
        int first = ng;
        for (int v = 0; v < nv; v++) {
            const Value *val = ir_value(g, v);
            if (root[v] != v || (int)val->place != s) continue;
            int pers = persistent_role(val->role);
            groups[ng++] = (Group){v, ir_nbytes(val), 0, pers ? 0 : start[v], pers ? g->n_nodes : end[v], pers};
        }
        g->space_bytes[s] = plan_space(g, groups + first, ng - first);
    }

    for (int i = 0; i < ng; i++) {
        Value *val = &g->values[groups[i].root];
        val->offset = groups[i].offset;
        val->live_start = groups[i].start;
        val->live_end = groups[i].end;
    }
    for (int v = 0; v < nv; v++) {
        Value *val = &g->values[v];
        const Value *r = ir_value(g, root[v]);
        FS_ASSERT(val->place == r->place);  // a view lies in its root's space
        val->alias = root[v] == v ? -1 : root[v];
        val->offset = r->offset + at[v];
        val->rank_stride = stride[v];
        val->live_start = r->live_start;
        val->live_end = r->live_end;
    }
    g->planned = 1;
    return 0;
}
