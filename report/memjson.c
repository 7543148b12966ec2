/* report/memjson.c: the memory report as JSON (fsc --mem=json), with jansson. The same
 * content as the text report, in bytes (integers) rather than rounded units:
 *
 *   {"model", "ranks": {"first", "last", "label"}, "world", "arena_bytes", "peak_bytes",
 *    "arena_over_peak", "peak_op": {"index", "op", "phase", "line", "col", "block",
 *    "where"}, "n_ops", "params": {"count", "bytes_by_dtype": {"f32": n}},
 *    "model_state" (the device space's) and "host_model_state" (offload's), ZeRO's
 *    categories (report/memstate.c): {"bytes", "bytes_per_param", "params16", "grads16",
 *    "params" (fp32), "grads32", "optimizer_state"}, "categories": [{"key", "name",
 *    "at_peak", "max"}] (keys: report_category_key), "host": {"peak_bytes",
 *    "peak_op", "categories": [...]}, "top_tensors": [{"id", "name", "dtype", "shape",
 *    "bytes", "category", "made_by"}], "n_live_at_peak", "saved_by_block": [{"block",
 *    "layer", "bytes"}], "saved_outside_blocks", "shard", "shard_applied",
 *    "cuda_workspace_bytes" (outside the arena, CUDA ranks; 0 without a CUDA program)}
 *
 * A plan of several stages: {"model", "world", "dp_world", "n_stages", "largest_stage":
 * {"stage", "arena_bytes"}, "stages": [the object above for each stage's program, with
 * "stage" and "label" ("stage 1 of 2 (ranks 4-7)"); its "ranks" are the stage's]}.
 */
#include "report.h"

#include <jansson.h>

/* Adds v under key; remembers a failure (out of memory) in *bad. */
static void put(json_t *o, const char *key, json_t *v, int *bad)
{
    if (!v || json_object_set_new(o, key, v)) *bad = 1;
}

/* Strings from the plan, cleaned: always valid UTF-8, whatever the file held. */
static json_t *jstr(const char *s)
{
    char buf[64];
    return json_string(report_clean(s, buf, sizeof buf));
}

static void push(json_t *a, json_t *v, int *bad)
{
    if (!v || json_array_append_new(a, v)) *bad = 1;
}

static json_t *categories(const MemReport *r, PlanPlace pl, int *bad)
{
    json_t *a = json_array();
    for (int c = 0; c < MEM_CAT_COUNT && a; c++) {
        json_t *o = json_object();
        if (o) {
            put(o, "key", json_string(report_category_key((MemCategory)c)), bad);
            put(o, "name", json_string(report_category_name((MemCategory)c)), bad);
            put(o, "at_peak", json_integer(r->at_peak[pl][c]), bad);
            put(o, "max", json_integer(r->max_cat[pl][c]), bad);
        }
        push(a, o, bad);
    }
    return a;
}

static json_t *peak_op(const MemReport *r, int *bad)
{
    const Plan *p = r->plan;
    int32_t k = r->peak_at[PLAN_PLACE_DEVICE];
    json_t *o = json_object();
    char where[256];
    if (!o) return NULL;
    put(o, "index", json_integer(k), bad);
    put(o, "where", json_string(report_op_where(p, p->n_ops ? k : PLAN_NONE, where, sizeof where)), bad);
    if (!p->n_ops) return o;
    const PlanOp *op = &p->ops[k];
    put(o, "op", jstr(plan_str(p, op->op)), bad);
    put(o, "phase", json_string(plan_phase_name(op->phase)), bad);
    put(o, "line", json_integer(op->line), bad);
    put(o, "col", json_integer(op->col), bad);
    put(o, "block", op->block == PLAN_NONE ? json_null() : jstr(plan_str(p, p->blocks[op->block].name)), bad);
    return o;
}

static json_t *tensor(const MemReport *r, const MemTensor *m, int *bad)
{
    const Plan *p = r->plan;
    const PlanTensor *t = &p->tensors[m->tensor];
    char name[64], made[160];
    json_t *o = json_object(), *shape = json_array();
    for (int32_t d = 0; d < t->rank && shape; d++) push(shape, json_integer(t->shape[d]), bad);
    if (!o) return json_decref(shape), NULL;
    put(o, "id", json_integer(m->tensor), bad);
    put(o, "name", json_string(report_tensor_name(p, m->tensor, name, sizeof name)), bad);
    put(o, "dtype", json_string(plan_dtype_name(t->dtype)), bad);
    put(o, "shape", shape, bad);
    put(o, "bytes", json_integer(m->bytes), bad);
    put(o, "category", json_string(report_category_key(m->cat)), bad);
    put(o, "made_by", json_string(report_made_by(p, m->tensor, made, sizeof made)), bad);
    return o;
}

static json_t *params(const MemReport *r, int *bad)
{
    json_t *o = json_object(), *d = json_object();
    for (int i = 0; i < PLAN_DT_COUNT && d; i++) {
        int64_t both = r->param_dtype[PLAN_PLACE_DEVICE][i] + r->param_dtype[PLAN_PLACE_HOST][i];
        if (both) put(d, plan_dtype_name((PlanDType)i), json_integer(both), bad);
    }
    if (!o) return json_decref(d), NULL;
    put(o, "count", json_integer(r->param_count), bad);
    put(o, "bytes_by_dtype", d, bad);
    return o;
}

/* Each ZeRO category under its category key, but the optimizer state's, which keeps
 * the key it always had here. */
static json_t *model_state(const MemReport *r, const int64_t *st, int *bad)
{
    json_t *o = json_object();
    if (!o) return NULL;
    int64_t sum = report_state_sum(st);
    double n = r->param_count > 0 ? (double)r->param_count : 1;
    put(o, "bytes", json_integer(sum), bad);
    put(o, "bytes_per_param", json_real((double)sum / n), bad);
    for (int c = MEM_PARAMS16; c <= MEM_OPT_STATE; c++)
        put(o, c == MEM_OPT_STATE ? "optimizer_state" : report_category_key((MemCategory)c), json_integer(st[c]), bad);
    return o;
}

static json_t *ranks(const MemReport *r, int *bad)
{
    json_t *o = json_object();
    char label[32];
    if (!o) return NULL;
    int64_t first = (int64_t)r->stage * (r->world > 1 ? r->world : 1);
    put(o, "first", json_integer(first), bad);
    put(o, "last", json_integer(first + (r->world > 1 ? r->world : 1) - 1), bad);
    put(o, "label", json_string(report_ranks(r, label, sizeof label)), bad);
    return o;
}

static json_t *host(const MemReport *r, int *bad)
{
    json_t *o = json_object();
    if (!o) return NULL;
    put(o, "arena_bytes", json_integer(r->host_arena_bytes), bad);
    put(o, "peak_bytes", json_integer(r->peak[PLAN_PLACE_HOST]), bad);
    put(o, "peak_op", json_integer(r->peak_at[PLAN_PLACE_HOST]), bad);
    put(o, "categories", categories(r, PLAN_PLACE_HOST, bad), bad);
    return o;
}

static json_t *saved(const MemReport *r, int *bad)
{
    const Plan *p = r->plan;
    json_t *a = json_array();
    for (int32_t b = 0; b < p->n_blocks && a; b++) {
        json_t *o = json_object();
        if (o) {
            put(o, "block", jstr(plan_str(p, p->blocks[b].name)), bad);
            put(o, "layer", jstr(plan_str(p, p->blocks[b].layer)), bad);
            put(o, "bytes", json_integer(r->saved_by_block[b]), bad);
        }
        push(a, o, bad);
    }
    return a;
}

static json_t *build(const MemReport *r, int *bad)
{
    const Plan *p = r->plan;
    int64_t peak = r->peak[PLAN_PLACE_DEVICE];
    json_t *o = json_object(), *top = json_array();
    for (int i = 0; i < r->n_top && top; i++) push(top, tensor(r, &r->top[i], bad), bad);
    if (!o) return json_decref(top), NULL;
    put(o, "model", jstr(plan_meta_str(p, "model", "model")), bad);
    if (r->n_stages > 1) {
        char label[96];
        put(o, "stage", json_integer(r->stage), bad);
        put(o, "label", json_string(report_label(r, label, sizeof label)), bad);
    }
    put(o, "ranks", ranks(r, bad), bad);
    put(o, "world", json_integer(r->world), bad);
    put(o, "arena_bytes", json_integer(r->arena_bytes), bad);
    put(o, "peak_bytes", json_integer(peak), bad);
    put(o, "arena_over_peak", peak > 0 ? json_real((double)r->arena_bytes / (double)peak) : json_null(), bad);
    put(o, "n_ops", json_integer(p->n_ops), bad);
    put(o, "peak_op", peak_op(r, bad), bad);
    put(o, "params", params(r, bad), bad);
    put(o, "model_state", model_state(r, r->state, bad), bad);
    put(o, "host_model_state", model_state(r, r->host_state, bad), bad);
    put(o, "categories", categories(r, PLAN_PLACE_DEVICE, bad), bad);
    put(o, "host", host(r, bad), bad);
    put(o, "cuda_workspace_bytes", json_integer(r->cuda_workspace), bad);
    put(o, "n_live_at_peak", json_integer(r->n_live_at_peak), bad);
    put(o, "top_tensors", top, bad);
    put(o, "saved_by_block", saved(r, bad), bad);
    put(o, "saved_outside_blocks", json_integer(r->saved_by_block[p->n_blocks]), bad);
    put(o, "shard", jstr(plan_meta_str(p, "shard", "none")), bad);
    put(o, "shard_applied", json_boolean(r->shard_applied), bad);
    return o;
}

static int dump(json_t *o, int bad, FILE *out)
{
    int rc = !o || bad || json_dumpf(o, out, JSON_INDENT(2)) || fputc('\n', out) == EOF ? -1 : 0;
    json_decref(o);
    return rc;
}

int report_mem_json(const MemReport *r, FILE *out)
{
    int bad = 0;
    json_t *o = build(r, &bad);
    return dump(o, bad, out);
}

static json_t *stages(const MemStages *s, int *bad)
{
    const MemReport *big = report_stages_largest(s);
    json_t *o = json_object(), *a = json_array(), *largest = json_object();
    for (int32_t k = 0; k < s->n && a; k++) push(a, build(s->stage[k], bad), bad);
    if (largest) {
        put(largest, "stage", json_integer(s->largest), bad);
        put(largest, "arena_bytes", json_integer(big->arena_bytes), bad);
    }
    if (!o) return json_decref(a), json_decref(largest), NULL;
    put(o, "model", jstr(plan_meta_str(s->plan, "model", "model")), bad);
    put(o, "world", json_integer(report_mul_sat(s->n, s->stage[0]->world)), bad);
    put(o, "dp_world", json_integer(s->stage[0]->world), bad);
    put(o, "n_stages", json_integer(s->n), bad);
    put(o, "largest_stage", largest, bad);
    put(o, "stages", a, bad);
    return o;
}

int report_stages_json(const MemStages *s, FILE *out)
{
    if (s->n == 1) return report_mem_json(s->stage[0], out);
    int bad = 0;
    json_t *o = stages(s, &bad);
    return dump(o, bad, out);
}
