/* runtime/resume.c: a checkpoint (checkpoint.c) into the state of a plan of the same
 * model, whatever plan saved it: another world, strategy, precision, stages, offload.
 *
 * Both sides speak logical tensors (state.c): the checkpoint holds pieces of each,
 * tiling it; this rank holds pieces of some, in its flat buffers, shards and spaces.
 * Each piece this rank holds is filled from the checkpoint pieces it meets, and every
 * element is counted: a piece not covered whole is an error, and so is a tensor of this
 * plan that the checkpoint lacks or holds in another shape or dtype, named. The one
 * exception is step state a plan of another precision has not (an fp16 loss scale and
 * its counter after an fp32 run): it stays where the plan starts it, and the report
 * says so; so does a delayed update's pending state (delayed_update) that a checkpoint
 * of a run without one lacks: nothing pending. A training plan without delayed_update
 * refuses a checkpoint that holds a pending update, which it would drop. A checkpoint
 * piece is read once per rank that needs it, its CRC checked before a byte of it is
 * used: straight into the arena when this rank's piece holds it whole, else through one
 * buffer the size of the largest such piece.
 *
 * Over the world, the elements the ranks own (what they would write) must equal the
 * elements of the checkpoint's tensors this plan has: the one-line report's "each
 * element once".
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"
#include "runtime.h"

static int by_name(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

typedef struct {
    const RtPiece *x;
} Need;

static int by_need(const void *a, const void *b)
{
    const RtPiece *x = ((const Need *)a)->x, *y = ((const Need *)b)->x;
    int c = strcmp(x->name, y->name);
    return c ? c : x->first < y->first ? -1 : x->first > y->first;
}

/* Every logical tensor name of the whole plan (all stages), sorted, once each. */
static const char **plan_names(const Plan *whole, RtState ***states, int32_t *n_states, int32_t *n, char *err,
                               size_t errlen)
{
    *n = 0, *n_states = whole->n_programs;
    *states = plan_alloc(sizeof **states * (size_t)whole->n_programs);
    if (!*states) return plan_fail(err, errlen, "out of memory"), NULL;
    memset(*states, 0, sizeof **states * (size_t)whole->n_programs);
    int32_t total = 0;
    for (int32_t k = 0; k < whole->n_programs; k++) {
        char why[512];
        Plan *one = whole->n_programs > 1 ? plan_extract_program(whole, k, why, sizeof why) : NULL;
        if (whole->n_programs > 1 && !one) return plan_fail(err, errlen, "stage %d: %s", k, why), NULL;
        (*states)[k] = rt_state_of_plan(one ? one : whole, err, errlen);
        plan_free(one);
        if (!(*states)[k]) return NULL;
        total += rt_state_count((*states)[k]);
    }
    const char **names = plan_alloc(sizeof *names * (size_t)(total + 1));
    if (!names) return plan_fail(err, errlen, "out of memory"), NULL;
    for (int32_t k = 0; k < whole->n_programs; k++)
        for (int32_t i = 0; i < rt_state_count((*states)[k]); i++) names[(*n)++] = rt_state_piece((*states)[k], i)->name;
    qsort(names, (size_t)*n, sizeof *names, by_name);
    int32_t kept = 0;
    for (int32_t i = 0; i < *n; i++)
        if (!kept || strcmp(names[kept - 1], names[i])) names[kept++] = names[i];
    *n = kept;
    return names;
}

static void append(char *buf, size_t n, const char *name)
{
    size_t at = strlen(buf);
    if (at + strlen(name) + 8 >= n) {
        if (at + 4 < n && !strstr(buf, "...")) snprintf(buf + at, n - at, ", ...");
        return;
    }
    snprintf(buf + at, n - at, "%s%s", at ? ", " : "", name);
}

/* A delayed update's state (delayed_update: passes/offload.c): the coefficient its
 * pending update reads, NaN while none is pending, and each update's pending gradient. */
#define PENDING_COEF "pending.coef"

static int is_pending_grad(const char *name)
{
    size_t n = strlen(name), k = strlen(".pending_grad");
    return n > k && !strcmp(name + n - k, ".pending_grad");
}

static int holds(const Need *need, int32_t n, const char *name)
{
    for (int32_t i = 0; i < n; i++)
        if (!strcmp(need[i].x->name, name)) return 1;
    return 0;
}

/* A training plan without delayed_update would drop the update a delayed run's
 * checkpoint holds pending: refused (the sampling program, with no optimizer, reads the
 * params alone). */
static int check_pending(const RtCheckpoint *c, const Need *need, int32_t n, char *err, size_t errlen)
{
    if (rt_checkpoint_find(c, PENDING_COEF) < 0 || holds(need, n, PENDING_COEF) || !holds(need, n, "opt_step"))
        return 0;
    return plan_fail(err, errlen, "%s was saved by a run with delayed_update 1, whose last step's update is still "
                     "pending in it (its gradient and coefficient); this plan has no delayed update to run it: compile "
                     "it with --delayed_update 1 (and --offload), or --resume-partial to drop that update",
                     rt_checkpoint_dir(c));
}

/* Each needed piece's checkpoint counterpart checked (present, same shape and dtype);
 * the holders of a missing step state are marked in keep. With partial, a piece the
 * checkpoint lacks or holds in another shape or dtype is marked in skip instead of an
 * error, its tensor named in r->kept. */
static int check_needs(const RtCheckpoint *c, const Need *need, int32_t n, int partial, uint8_t *keep, uint8_t *skip,
                       RtResumed *r, char *err, size_t errlen)
{
    char a[128], b[128];
    for (int32_t i = 0; i < n; i++) {
        const RtPiece *x = need[i].x;
        int32_t at = rt_checkpoint_find(c, x->name);
        /* A checkpoint of no delayed update: none pending, as at the start (coef NaN). */
        int no_pending = is_pending_grad(x->name) && rt_checkpoint_find(c, PENDING_COEF) < 0;
        if (at < 0 && (x->kind == RT_STATE_OTHER || no_pending)) {
            keep[x->holder] = 1;
            if (!strstr(r->kept, x->name)) append(r->kept, sizeof r->kept, x->name);
            continue;
        }
        RtPiece cp;
        if (at >= 0) rt_checkpoint_piece(c, at, &cp);
        int same = at >= 0 && cp.rank == x->rank && cp.dtype == x->dtype;
        for (int d = 0; same && d < x->rank; d++) same = cp.shape[d] == x->shape[d];
        if (!same && partial) {
            skip[i] = 1;
            if (!strstr(r->kept, x->name)) append(r->kept, sizeof r->kept, x->name);
            continue;
        }
        if (at < 0)
            return plan_fail(err, errlen, "%s: no %s '%s', which this plan has (%s)", rt_checkpoint_dir(c),
                             x->kind == RT_STATE_PARAM ? "param" : "optimizer state", x->name,
                             x->kind == RT_STATE_PARAM ? "a checkpoint of another model?"
                                                       : "saved with another optimizer, or with its param frozen?");
        if (!same)
            return plan_fail(err, errlen, "%s: tensor '%s' is %s in the checkpoint but %s in this plan (%s)",
                             rt_checkpoint_dir(c), x->name, rt_st_shape_str(cp.dtype, cp.rank, cp.shape, a, sizeof a),
                             rt_st_shape_str(x->dtype, x->rank, x->shape, b, sizeof b),
                             cp.dtype != x->dtype ? "a different dtype" : "a changed shape: another model, or other -D dims");
    }
    return 0;
}

/* Piece x's elements from the checkpoint pieces that meet it, from piece `at` (the first
 * of its name) on; buf: room for the largest piece read whole (grown as needed). */
static int fill(const RtCheckpoint *c, const RtPiece *x, int32_t at, uint8_t **buf, uint64_t *cap, int32_t *in_buf,
                char *err, size_t errlen)
{
    int64_t es = plan_dtype_size(x->dtype), covered = 0, end = x->first + x->count;
    uint8_t *dst = x->data;
    for (int32_t j = at; j < rt_checkpoint_count(c); j++) {
        RtPiece cp;
        rt_checkpoint_piece(c, j, &cp);
        if (strcmp(cp.name, x->name) || cp.first >= end) break;
        int64_t lo = cp.first > x->first ? cp.first : x->first;
        int64_t hi = cp.first + cp.count < end ? cp.first + cp.count : end;
        if (lo >= hi) continue;
        if (cp.first >= x->first && cp.first + cp.count <= end) {  // all of it lands here: read it in place
            if (rt_checkpoint_read(c, j, dst + (cp.first - x->first) * es, err, errlen)) return -1;
        } else {
            if (*in_buf != j) {
                uint64_t bytes = (uint64_t)(cp.count * es);
                if (bytes > *cap) {
                    plan_dealloc(*buf);
                    if (!(*buf = plan_alloc((size_t)bytes)))
                        return *cap = 0, plan_fail(err, errlen, "out of memory reading '%s'", x->name);
                    *cap = bytes;
                }
                *in_buf = -1;
                if (rt_checkpoint_read(c, j, *buf, err, errlen)) return -1;
                *in_buf = j;
            }
            memcpy(dst + (lo - x->first) * es, *buf + (lo - cp.first) * es, (size_t)((hi - lo) * es));
        }
        covered += hi - lo;
    }
    if (covered != x->count)
        return plan_fail(err, errlen, "%s: '%s' elements [%" PRId64 ", %" PRId64 ") are only %" PRId64 " covered",
                         rt_checkpoint_dir(c), x->name, x->first, end, covered);
    return 0;
}

/* Over the world, the elements the ranks own, by kind, against the checkpoint's elements
 * of the tensors the plan has (less the step state it keeps at its start). */
static int account(const RtCheckpoint *c, const Need *need, int32_t n, const uint8_t *keep, const uint8_t *skip,
                   int partial, const Plan *whole, RtResumed *r, char *err, size_t errlen)
{
    uint64_t mine[RT_STATE_COUNT] = {0}, *all = plan_alloc(sizeof *all * RT_STATE_COUNT * (size_t)rt_comm_world());
    if (!all) return plan_fail(err, errlen, "out of memory");
    for (int32_t i = 0; i < n; i++) {
        const RtPiece *x = need[i].x;
        if (x->own && !keep[x->holder] && !skip[i]) mine[x->kind] += (uint64_t)x->count;
    }
    rt_comm_allgather_u64(mine, RT_STATE_COUNT, all);
    memset(r->elements, 0, sizeof r->elements);
    for (int w = 0; w < rt_comm_world(); w++)
        for (int k = 0; k < RT_STATE_COUNT; k++) r->elements[k] += (int64_t)all[(size_t)w * RT_STATE_COUNT + (size_t)k];
    plan_dealloc(all);
    RtState **states = NULL;
    int32_t n_states = 0, n_names = 0;
    const char **names = plan_names(whole, &states, &n_states, &n_names, err, errlen);
    int rc = names ? 0 : -1;
    int64_t want[RT_STATE_COUNT] = {0};
    for (int32_t i = 0; i < rt_checkpoint_count(c) && !rc; i++) {
        RtPiece cp;
        rt_checkpoint_piece(c, i, &cp);
        if (!bsearch(&cp.name, names, (size_t)n_names, sizeof *names, by_name)) {
            if (!cp.first) append(r->unused, sizeof r->unused, cp.name);
        } else {
            want[cp.kind] += cp.count;
        }
    }
    for (int k = 0; k < RT_STATE_COUNT && !rc && !partial; k++)  // partial: what was left out is not counted
        if (want[k] != r->elements[k])
            rc = plan_fail(err, errlen, "%s: the ranks of this plan own %" PRId64 " %s elements, the checkpoint has %"
                           PRId64 " of the tensors this plan has (a bug: please report it)", rt_checkpoint_dir(c),
                           r->elements[k], rt_state_kind_name((RtStateKind)k), want[k]);
    plan_dealloc(names);
    for (int32_t k = 0; states && k < n_states; k++) rt_state_free(states[k]);
    plan_dealloc(states);
    return rc;
}

/* The bytes of the pieces marked in skip, into one buffer (save) or back (restore): what
 * zeroing their holders' padding would wipe of the values they started with. */
static void stash(const Need *need, int32_t n, const uint8_t *skip, uint8_t *buf, int restore)
{
    for (int32_t i = 0; i < n; i++) {
        if (!skip[i]) continue;
        const RtPiece *x = need[i].x;
        size_t bytes = (size_t)x->count * (size_t)plan_dtype_size(x->dtype);
        if (restore) memcpy(x->data, buf, bytes);
        else memcpy(buf, x->data, bytes);
        buf += bytes;
    }
}

int rt_checkpoint_load_as(const RtCheckpoint *c, Exec *e, int partial, RtResumed *r, char *err, size_t errlen)
{
    const Plan *p = rt_exec_plan(e);
    memset(r, 0, sizeof *r);
    err[0] = 0;
    RtState *st = rt_state_new(e, err, errlen);
    int32_t n = st ? rt_state_count(st) : 0;
    Need *need = st ? plan_alloc(sizeof *need * (size_t)(n + 1)) : NULL;
    uint8_t *keep = st ? plan_alloc((size_t)p->n_tensors + 1) : NULL, *buf = NULL, *kept = NULL;
    uint8_t *skip = st ? plan_alloc((size_t)n + 1) : NULL;
    int rc = !st ? -1 : !need || !keep || !skip ? plan_fail(err, errlen, "out of memory") : 0;
    if (!rc) {
        memset(keep, 0, (size_t)p->n_tensors + 1);
        memset(skip, 0, (size_t)n + 1);
        for (int32_t i = 0; i < n; i++) need[i].x = rt_state_piece(st, i);
        qsort(need, (size_t)n, sizeof *need, by_need);
        rc = partial ? 0 : check_pending(c, need, n, err, errlen);
        if (!rc) rc = check_needs(c, need, n, partial, keep, skip, r, err, errlen);
    }
    size_t skipped = 0;
    for (int32_t i = 0; i < n && !rc; i++)
        if (skip[i]) skipped += (size_t)need[i].x->count * (size_t)plan_dtype_size(need[i].x->dtype);
    if (!rc && skipped && !(kept = plan_alloc(skipped))) rc = plan_fail(err, errlen, "out of memory");
    if (!rc) {  // the holders' padding zero; step state the checkpoint lacks stays as the plan starts it
        const int32_t *ids;
        int32_t nh = rt_state_holders(st, &ids);
        if (kept) stash(need, n, skip, kept, 0);
        for (int32_t i = 0; i < nh; i++)
            if (!keep[ids[i]]) memset(rt_exec_data(e, ids[i]), 0, (size_t)plan_tensor_nbytes(&p->tensors[ids[i]]));
        if (kept) stash(need, n, skip, kept, 1);
    }
    plan_dealloc(kept);
    uint64_t cap = 0;
    int32_t in_buf = -1;
    for (int32_t i = 0; i < n && !rc; i++) {
        const RtPiece *x = need[i].x;
        if (!keep[x->holder] && !skip[i])
            rc = fill(c, x, rt_checkpoint_find(c, x->name), &buf, &cap, &in_buf, err, errlen);
    }
    plan_dealloc(buf);
    if (!rc) {  // tied params with bytes of their own start again from their target
        for (int32_t i = 0; i < p->n_tensors; i++) {
            const PlanTensor *pt = &p->tensors[i];
            if (pt->role != PLAN_ROLE_PARAM || pt->tied_to == PLAN_NONE) continue;
            void *dst = rt_exec_data(e, i), *src = rt_exec_data(e, pt->tied_to);
            if (dst != src) memmove(dst, src, (size_t)plan_tensor_nbytes(pt));
        }
        rt_exec_cast_params(e);  // the 16-bit params the update writes: from the loaded master
    }
    rc = rt_comm_agree(rc ? 1 : 0) ? -1 : 0;
    if (!rc && account(c, need, n, keep, skip, partial, rt_exec_whole(e), r, err, errlen)) rc = -1;
    rc = rt_comm_agree(rc ? 1 : 0) ? -1 : 0;
    char h[24];
    snprintf(h, sizeof h, "%016" PRIx64, rt_plan_hash(rt_exec_whole(e)));
    const char *saved = rt_checkpoint_info(c, "hash");
    r->same_plan = saved && !strcmp(saved, h);
    r->files = (int)rt_checkpoint_info_int(c, "world", 0);
    plan_dealloc(need);
    plan_dealloc(skip);
    plan_dealloc(keep);
    rt_state_free(st);
    return rc;
}

int rt_checkpoint_load(const RtCheckpoint *c, Exec *e, RtResumed *r, char *err, size_t errlen)
{
    return rt_checkpoint_load_as(c, e, 0, r, err, errlen);
}

void rt_resumed_describe(const RtCheckpoint *c, const RtResumed *r, const Plan *whole, char *buf, size_t n)
{
    char a[32], b[32], d[32], from[160], to[160];
    RtLayout l;
    char why[128];
    if (rt_plan_layout(whole, &l, why, sizeof why)) l = (RtLayout){1, 1, 1, 1};
    snprintf(from, sizeof from, "world %" PRId64 "%s, %s, %s", rt_checkpoint_info_int(c, "world", 0),
             rt_checkpoint_info_int(c, "stages", 1) > 1 ? " in stages" : "", rt_checkpoint_info(c, "shard"),
             rt_checkpoint_info(c, "precision"));
    snprintf(to, sizeof to, "world %d%s, %s, %s", l.world, l.stages > 1 ? " in stages" : "",
             plan_meta_str(whole, "shard", "none"), plan_meta_str(whole, "precision", "fp32"));
    int at = snprintf(buf, n, "resumed %s at step %" PRId64 ": %s params, %s optimizer and %s step-state elements "
                      "from %d file%s, each element once; %s", rt_checkpoint_dir(c), rt_checkpoint_step(c),
                      report_grouped(r->elements[RT_STATE_PARAM], a, sizeof a), report_grouped(r->elements[RT_STATE_OPTIM], b, sizeof b),
                      report_grouped(r->elements[RT_STATE_OTHER], d, sizeof d), r->files, r->files == 1 ? "" : "s",
                      r->same_plan ? "the plan that saved it" : "");
    if (!r->same_plan && at > 0 && (size_t)at < n)
        at += snprintf(buf + at, n - (size_t)at, "saved by %s, resharded to %s", from, to);
    if (r->unused[0] && at > 0 && (size_t)at < n)
        at += snprintf(buf + at, n - (size_t)at, "; not in this plan: %s", r->unused);
    if (r->kept[0] && at > 0 && (size_t)at < n)
        snprintf(buf + at, n - (size_t)at, "; not in the checkpoint, at their start: %s", r->kept);
}
