/* report/memreport.c: the memory report's numbers, from the plan alone.
 *
 * A buffer is a root tensor (alias == PLAN_NONE); views lie inside their root and add no
 * bytes. A root is live at op i when live_start <= i <= live_end (memplan: persistent
 * state from 0 to n_ops, everything else from its producer to its last reader), and the
 * timeline sums the bytes of live roots at every op, per placement and per category,
 * with one pass of difference arrays: O(tensors + ops x categories), so a 1.5B-param
 * plan is reported in milliseconds.
 *
 * The plan may come from a file (fsexec --inspect): it passed plan_check, so ids are in
 * range, but live ranges, alias chains and sizes are not trusted: ranges are clamped,
 * chains are followed a bounded number of steps, and each buffer's bytes are capped so
 * no sum can overflow.
 *
 * What each category holds, and the model state that ZeRO counts: report/memstate.c.
 */
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "report.h"

/* In MemCategory's order. Keys are JSON keys and CSS classes: "params" is the fp32
 * storage it always was (now with the masters), and the two 16-bit categories and the
 * fp32 grads have keys of their own ("grads" held both dtypes). */
static const char *const NAMES[MEM_CAT_COUNT] = {
    "16-bit params", "16-bit grads", "fp32 params", "fp32 grads", "optimizer state", "gathered params", "inputs",
    "saved for backward", "recompute temporaries", "other activations", "communication buffers",
    "scratch / workspace", "constants", "kv cache",
};
static const char *const KEYS[MEM_CAT_COUNT] = {
    "params16", "grads16", "params", "grads32", "opt_state", "gathered", "inputs", "saved", "recompute", "acts", "comm",
    "scratch", "consts", "kv_cache",
};

const char *report_category_name(MemCategory c) { return (unsigned)c < MEM_CAT_COUNT ? NAMES[c] : "?"; }
const char *report_category_key(MemCategory c) { return (unsigned)c < MEM_CAT_COUNT ? KEYS[c] : "?"; }

static void clamp_range(const MemReport *r, const PlanTensor *t, int32_t *s, int32_t *e)
{
    int32_t last = r->n_points - 1;
    *s = t->live_start < 0 ? 0 : t->live_start > last ? last : t->live_start;
    *e = t->live_end > last ? last : t->live_end;
}

static void find_roots(MemReport *r)
{
    const Plan *p = r->plan;
    for (int32_t t = 0; t < p->n_tensors; t++) {
        int32_t u = t;
        for (int32_t steps = 0; p->tensors[u].alias != PLAN_NONE && steps < p->n_tensors; steps++)
            u = p->tensors[u].alias;
        r->root[t] = p->tensors[u].alias == PLAN_NONE ? u : t;  // a cycle: its own buffer
    }
}

/* Each root's category (report/memstate.c), activations split by what reads them: made
 * by a recompute op, or made in the forward and read by a backward or recompute op (what
 * the forward keeps for the backward); views take their root's. */
static void categorize(MemReport *r, uint8_t *read_back)
{
    const Plan *p = r->plan;
    for (int32_t k = 0; k < p->n_ops; k++) {
        const PlanOp *op = &p->ops[k];
        if (op->phase != PLAN_PHASE_BACKWARD && op->phase != PLAN_PHASE_RECOMPUTE && op->phase != PLAN_PHASE_WGRAD) continue;
        for (int32_t i = 0; i < op->n_in; i++) read_back[r->root[p->ids[op->in + i]]] = 1;
    }
    for (int32_t t = 0; t < p->n_tensors; t++) {
        const PlanTensor *x = &p->tensors[t];
        MemCategory c = report_category_of(r, t);
        if (c == MEM_ACTS && x->producer != PLAN_NONE) {
            PlanPhase ph = p->ops[x->producer].phase;
            if (ph == PLAN_PHASE_RECOMPUTE)
                c = MEM_RECOMPUTE;
            else if (ph == PLAN_PHASE_FORWARD && read_back[t])
                c = MEM_SAVED;
        }
        r->cat[t] = (uint8_t)c;
    }
    for (int32_t t = 0; t < p->n_tensors; t++) {
        PlanDType d = p->tensors[t].dtype;
        r->cat[t] = r->cat[r->root[t]];
        if (r->root[t] == t && (unsigned)d < PLAN_DT_COUNT) r->cat_dtypes[r->cat[t]] |= 1u << d;
    }
}

/* Difference arrays over the ops, then prefix sums: the bytes live at every op. */
static void timeline(MemReport *r)
{
    const Plan *p = r->plan;
    int32_t n = r->n_points;
    for (int32_t t = 0; t < p->n_tensors; t++) {
        const PlanTensor *x = &p->tensors[t];
        int32_t s, e;
        clamp_range(r, x, &s, &e);
        if (x->alias != PLAN_NONE || s > e) continue;
        int64_t b = report_buffer_bytes(p, t), *live = r->live[x->place], *cat = r->live_cat[x->place];
        live[s] += b, live[e + 1] -= b;
        cat[(int64_t)s * MEM_CAT_COUNT + r->cat[t]] += b;
        cat[(int64_t)(e + 1) * MEM_CAT_COUNT + r->cat[t]] -= b;
    }
    for (int pl = 0; pl < PLAN_PLACE_COUNT; pl++) {
        int64_t *live = r->live[pl];
        r->peak_at[pl] = 0;
        for (int32_t i = 0; i < n; i++) {
            int64_t *row = &r->live_cat[pl][(int64_t)i * MEM_CAT_COUNT];
            if (i) live[i] += live[i - 1];
            for (int c = 0; c < MEM_CAT_COUNT; c++) {
                if (i) row[c] += row[c - MEM_CAT_COUNT];
                if (row[c] > r->max_cat[pl][c]) r->max_cat[pl][c] = row[c];
            }
            if (live[i] > live[r->peak_at[pl]]) r->peak_at[pl] = i;
        }
        r->peak[pl] = live[r->peak_at[pl]];
        memcpy(r->at_peak[pl], &r->live_cat[pl][(int64_t)r->peak_at[pl] * MEM_CAT_COUNT], sizeof r->at_peak[pl]);
    }
}

int report_live_at(const MemReport *r, int32_t op, PlanPlace place, int transient_only, MemTensor *out, int max)
{
    const Plan *p = r->plan;
    int n = 0, count = 0;
    for (int32_t t = 0; t < p->n_tensors; t++) {
        const PlanTensor *x = &p->tensors[t];
        int32_t s, e;
        clamp_range(r, x, &s, &e);
        if (x->alias != PLAN_NONE || x->place != place || op < s || op > e) continue;
        if (transient_only && plan_tensor_is_persistent(x)) continue;
        count++;
        MemTensor m = {t, report_buffer_bytes(p, t), (MemCategory)r->cat[t]};
        int at = n < max ? n++ : max;
        while (at > 0 && out[at - 1].bytes < m.bytes) {
            if (at < max) out[at] = out[at - 1];
            at--;
        }
        if (at < max) out[at] = m;
    }
    return count;
}

typedef struct {
    int32_t root, block;
} Read;

static int by_read(const void *a, const void *b)
{
    const Read *x = a, *y = b;
    if (x->block != y->block) return x->block < y->block ? -1 : 1;
    return x->root < y->root ? -1 : x->root > y->root;
}

/* Saved bytes per block whose backward reads them, each buffer once per block. */
static int saved_by_block(MemReport *r)
{
    const Plan *p = r->plan;
    Read *reads = plan_alloc(sizeof *reads * (size_t)(p->n_ids + 1));
    if (!reads) return -1;
    int32_t n = 0;
    for (int32_t k = 0; k < p->n_ops; k++) {
        const PlanOp *op = &p->ops[k];
        if (op->phase != PLAN_PHASE_BACKWARD && op->phase != PLAN_PHASE_RECOMPUTE && op->phase != PLAN_PHASE_WGRAD) continue;
        for (int32_t i = 0; i < op->n_in; i++) {
            int32_t root = r->root[p->ids[op->in + i]];
            if (r->cat[root] == MEM_SAVED) reads[n++] = (Read){root, op->block == PLAN_NONE ? p->n_blocks : op->block};
        }
    }
    qsort(reads, (size_t)n, sizeof *reads, by_read);
    for (int32_t i = 0; i < n; i++)
        if (i == 0 || by_read(&reads[i], &reads[i - 1]))
            r->saved_by_block[reads[i].block] += report_buffer_bytes(p, reads[i].root);
    plan_dealloc(reads);
    return 0;
}

int32_t report_block_run(const MemReport *r, int32_t b)
{
    const Plan *p = r->plan;
    int32_t e = b;
    while (e + 1 < p->n_blocks && p->blocks[e + 1].layer == p->blocks[b].layer &&
           r->saved_by_block[e + 1] == r->saved_by_block[b] && !r->block_ops[e + 1] == !r->block_ops[b])
        e++;
    return e;
}

static int is_collective(const char *op)
{
    const OpInfo *info = op_info_by_name(op);
    return info && (info->flags & OPF_COLLECTIVE);
}

/* Trainable elements: each named param once (fsdp gathers a block's params twice), not
 * the flat storages that hold them (a PARAM root that other PARAM tensors lie in, or
 * whose copy they lie in: offload's device copy of a ddp unit) nor a rank's shard of one. */
static int64_t param_count(const MemReport *r, uint8_t *seen)
{
    const Plan *p = r->plan;
    int64_t n = 0;
    memset(seen, 0, (size_t)p->n_tensors + (size_t)p->n_strs + 1);
    uint8_t *holds = seen, *named = seen + p->n_tensors;
    for (int32_t t = 0; t < p->n_tensors; t++) {
        if (p->tensors[t].role != PLAN_ROLE_PARAM || p->tensors[t].alias == PLAN_NONE) continue;
        int32_t copied = r->copy_of[r->root[t]];
        holds[p->tensors[t].alias] = 1;
        if (copied != PLAN_NONE) holds[copied] = 1;
    }
    for (int32_t t = 0; t < p->n_tensors; t++) {
        const PlanTensor *x = &p->tensors[t];
        if (x->role != PLAN_ROLE_PARAM || x->tied_to != PLAN_NONE || x->sharded || holds[t]) continue;
        if (x->name != PLAN_NONE && named[x->name]) continue;
        if (x->name != PLAN_NONE) named[x->name] = 1;
        int64_t k = plan_tensor_logical_numel(x);  // the model's own: a padded vocabulary's padding is no param
        n = n > INT64_MAX - k ? INT64_MAX : n + k;
    }
    return n;
}

/* Whether ranks share work, the trainable params, and the model state (memstate.c). */
static int totals(MemReport *r)
{
    const Plan *p = r->plan;
    uint8_t *seen = plan_alloc((size_t)p->n_tensors + (size_t)p->n_strs + 1);
    if (!seen) return -1;
    for (int32_t t = 0; t < p->n_tensors; t++) {
        const PlanTensor *x = &p->tensors[t];
        if (x->sharded || x->rank_stride || x->role == PLAN_ROLE_COMM || x->role == PLAN_ROLE_GATHERED)
            r->shard_applied = 1;
    }
    for (int32_t k = 0; k < p->n_ops && !r->shard_applied; k++)
        r->shard_applied = is_collective(plan_str(p, p->ops[k].op));
    r->param_count = param_count(r, seen);
    plan_dealloc(seen);
    return report_state_totals(r);
}

static int fail(char *err, size_t errlen, const char *msg)
{
    snprintf(err, errlen, "%s", msg);
    return -1;
}

static int build(MemReport *r, char *err, size_t errlen)
{
    const Plan *p = r->plan;
    if (p->n_programs < 1) return fail(err, errlen, "the plan has no program (no memory plan)");
    r->arena_bytes = p->programs[0].space_bytes[PLAN_PLACE_DEVICE];
    r->host_arena_bytes = p->programs[0].space_bytes[PLAN_PLACE_HOST];
    r->cuda_workspace = p->n_cuda ? plan_meta_int(p, "cuda_workspace_bytes", 0) : 0;
    r->frozen_count = plan_meta_int(p, "frozen_params", 0);
    r->world = p->programs[0].dp_world;
    r->n_points = p->n_ops > 0 ? p->n_ops : 1;
    size_t nt = (size_t)p->n_tensors + 1, np = (size_t)r->n_points + 1;
    r->cat = plan_alloc(nt * 2);
    r->root = plan_alloc(sizeof *r->root * nt);
    r->copy_of = plan_alloc(sizeof *r->copy_of * nt);
    r->marks = plan_alloc(nt);
    r->saved_by_block = plan_alloc(sizeof *r->saved_by_block * ((size_t)p->n_blocks + 1));
    r->block_ops = plan_alloc(sizeof *r->block_ops * ((size_t)p->n_blocks + 1));
    int ok = r->cat && r->root && r->copy_of && r->marks && r->saved_by_block && r->block_ops;
    for (int pl = 0; pl < PLAN_PLACE_COUNT; pl++) {
        r->live[pl] = plan_alloc(sizeof(int64_t) * np);
        r->live_cat[pl] = plan_alloc(sizeof(int64_t) * np * MEM_CAT_COUNT);
        ok = ok && r->live[pl] && r->live_cat[pl];
        if (!ok) continue;
        memset(r->live[pl], 0, sizeof(int64_t) * np);
        memset(r->live_cat[pl], 0, sizeof(int64_t) * np * MEM_CAT_COUNT);
    }
    if (!ok) return fail(err, errlen, "out of memory");
    memset(r->cat, 0, nt * 2);
    memset(r->saved_by_block, 0, sizeof *r->saved_by_block * ((size_t)p->n_blocks + 1));
    memset(r->block_ops, 0, sizeof *r->block_ops * ((size_t)p->n_blocks + 1));
    for (int32_t k = 0; k < p->n_ops; k++) r->block_ops[p->ops[k].block == PLAN_NONE ? p->n_blocks : p->ops[k].block]++;
    find_roots(r);
    if (report_state_marks(r)) return fail(err, errlen, "out of memory");
    categorize(r, r->cat + nt);
    timeline(r);
    if (totals(r)) return fail(err, errlen, "out of memory");
    r->n_live_at_peak = report_live_at(r, r->peak_at[PLAN_PLACE_DEVICE], PLAN_PLACE_DEVICE, 0, r->top, MEM_TOP_N);
    r->n_top = r->n_live_at_peak < MEM_TOP_N ? r->n_live_at_peak : MEM_TOP_N;
    return saved_by_block(r) ? fail(err, errlen, "out of memory") : 0;
}

MemReport *report_mem_new(const Plan *p, char *err, size_t errlen)
{
    MemReport *r = plan_alloc(sizeof *r);
    if (!r) {
        fail(err, errlen, "out of memory");
        return NULL;
    }
    memset(r, 0, sizeof *r);
    r->plan = p;
    r->n_stages = 1;
    if (build(r, err, errlen)) {
        report_mem_free(r);
        return NULL;
    }
    return r;
}

MemReport *report_mem_new_stage(const Plan *p, int32_t k, char *err, size_t errlen)
{
    if (p->n_programs <= 1) return report_mem_new(p, err, errlen);
    Plan *one = plan_extract_program(p, k, err, errlen);
    MemReport *r = one ? report_mem_new(one, err, errlen) : NULL;
    if (!r) {
        plan_free(one);
        return NULL;
    }
    r->own = one, r->stage = k, r->n_stages = p->n_programs;
    return r;
}

void report_mem_free(MemReport *r)
{
    if (!r) return;
    plan_free(r->own);
    for (int pl = 0; pl < PLAN_PLACE_COUNT; pl++) plan_dealloc(r->live[pl]), plan_dealloc(r->live_cat[pl]);
    plan_dealloc(r->cat);
    plan_dealloc(r->root);
    plan_dealloc(r->copy_of);
    plan_dealloc(r->marks);
    plan_dealloc(r->saved_by_block);
    plan_dealloc(r->block_ops);
    plan_dealloc(r);
}
