/* runtime/plan_inputs.c: what a plan's inputs and outputs say about the data it takes,
 * read from the plan alone (no Exec): its data inputs (any number, each once, in
 * declaration order), whether a model of two is a language model's tokens and targets
 * or a classifier's features and labels, a classifier's logits, the vocab tokens must
 * stay below, and for any input the bound its values must stay below because an op
 * indexes with them (rt_input_bound), with the one value outside it an op may allow
 * (rt_input_sentinel: an ignore_index). The data loader (data.c) and the plan's value
 * checks (opcheck_mem.c) both ask; neither asks the other, so what the loader checks is
 * what the value check assumes.
 */
#include <string.h>

#include "ops.h"
#include "runtime.h"

/* ---- what a plan needs ----------------------------------------------------------------- */

static int is_data_input(const PlanTensor *t) { return t->role == PLAN_ROLE_INPUT && t->step_role == PLAN_SR_NONE; }

/* Whether tensors i and j are one data input: the same, or named alike (two stages). */
static int same_input(const Plan *p, int32_t i, int32_t j)
{
    return i == j || (p->tensors[i].name != PLAN_NONE && !strcmp(plan_str(p, p->tensors[i].name),
                                                                 plan_str(p, p->tensors[j].name)));
}

int rt_data_input_list(const Plan *p, int32_t *ids, int max)
{
    int n = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        if (!is_data_input(&p->tensors[i])) continue;
        int seen = 0;
        for (int32_t j = 0; j < i && !seen; j++) seen = is_data_input(&p->tensors[j]) && same_input(p, i, j);
        if (seen) continue;
        if (n < max) ids[n] = i;
        n++;
    }
    return n;
}

int rt_data_inputs(const Plan *p, int32_t *a, int32_t *b)
{
    int32_t two[2] = {PLAN_NONE, PLAN_NONE};
    int n = rt_data_input_list(p, two, 2);
    *a = two[0], *b = two[1];
    return n == 2 ? 0 : -1;
}

int32_t rt_stage_input(const Plan *whole, int32_t w, const Plan *p)
{
    if (whole == p) return w;
    if (w == PLAN_NONE || whole->tensors[w].name == PLAN_NONE) return PLAN_NONE;
    const char *name = plan_str(whole, whole->tensors[w].name);
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (is_data_input(&p->tensors[i]) && !strcmp(plan_str(p, p->tensors[i].name), name)) return i;
    return PLAN_NONE;
}

void rt_stage_inputs(const Plan *whole, const Plan *p, int32_t *a, int32_t *b)
{
    int32_t wa, wb;
    int none = rt_data_inputs(whole, &wa, &wb);
    if (whole == p) {
        *a = none ? PLAN_NONE : wa, *b = none ? PLAN_NONE : wb;
        return;
    }
    *a = none ? PLAN_NONE : rt_stage_input(whole, wa, p);
    *b = none ? PLAN_NONE : rt_stage_input(whole, wb, p);
}

static int32_t find_output(const Plan *p, const char *name)
{
    for (int32_t i = 0; i < p->n_outputs; i++)
        if (!strcmp(plan_str(p, p->tensors[p->outputs[i]].name), name)) return p->outputs[i];
    return PLAN_NONE;
}

/* Whether tensor t is data input `input`, or rows of it: with gradient accumulation each
 * micro-batch reads its rows through a slice of the input (passes/pipeline.c). */
static int reads_input(const Plan *p, int32_t t, int32_t input)
{
    if (t == input) return 1;
    int32_t w = p->tensors[t].producer;
    return w != PLAN_NONE && !strcmp(plan_str(p, p->ops[w].op), "slice") && p->ops[w].n_in == 1 &&
           p->ids[p->ops[w].in] == input;
}

/* The logits input of the first cross_entropy whose targets are tensor `targets`. */
static int32_t loss_logits(const Plan *p, int32_t targets)
{
    for (int32_t k = 0; k < p->n_ops; k++) {
        const PlanOp *op = &p->ops[k];
        if (!strcmp(plan_str(p, op->op), "cross_entropy") && op->n_in == 2 && reads_input(p, p->ids[op->in + 1], targets))
            return p->ids[op->in];
    }
    return PLAN_NONE;
}

int32_t rt_plan_logits_for(const Plan *p, int32_t labels)
{
    int32_t logits = find_output(p, "logits");
    if (logits != PLAN_NONE || labels == PLAN_NONE) return logits;
    logits = loss_logits(p, labels);
    for (int32_t i = 0; i < p->n_outputs && logits != PLAN_NONE; i++)
        if (p->outputs[i] == logits) return logits;
    return PLAN_NONE;
}

int32_t rt_plan_logits(const Plan *p)
{
    int32_t x, y;
    return rt_plan_logits_for(p, rt_data_inputs(p, &x, &y) ? PLAN_NONE : y);
}

int64_t rt_plan_vocab(const Plan *p)
{
    int64_t v = plan_meta_int(p, "vocab", 0);
    if (v > 0) return v;
    int32_t tokens, targets;
    if (rt_data_inputs(p, &tokens, &targets)) return 65536;
    v = 65536;
    for (int32_t k = 0; k < p->n_ops; k++) {
        const PlanOp *op = &p->ops[k];
        if (!strcmp(plan_str(p, op->op), "embedding") && op->n_in == 2 && reads_input(p, p->ids[op->in + 1], tokens)) {
            const PlanTensor *table = &p->tensors[p->ids[op->in]];
            int64_t rows = table->rank == 2 ? rt_plan_valid_columns(p, table->shape[0]) : v;
            if (rows < v) v = rows;
        }
    }
    int32_t logits = loss_logits(p, targets);
    const PlanTensor *lt = logits == PLAN_NONE ? NULL : &p->tensors[logits];
    int64_t cols = lt && lt->rank >= 1 ? rt_plan_valid_columns(p, lt->shape[lt->rank - 1]) : v;
    return cols < v ? cols : v;
}

static int is_shape(const PlanTensor *t, PlanDType dt, int rank)
{
    return t->dtype == dt && t->rank == rank;
}

RtDataKind rt_data_kind(const Plan *p)
{
    int32_t a, b;
    if (rt_data_inputs(p, &a, &b)) return RT_DATA_NONE;
    const PlanTensor *x = &p->tensors[a], *y = &p->tensors[b];
    if (is_shape(x, PLAN_DT_I32, 2) && is_shape(y, PLAN_DT_I32, 2) && x->shape[0] == y->shape[0] &&
        x->shape[1] == y->shape[1])
        return RT_DATA_LM;
    if (is_shape(x, PLAN_DT_F32, 2) && is_shape(y, PLAN_DT_I32, 1) && x->shape[0] == y->shape[0])
        return RT_DATA_CLASSES;
    return RT_DATA_NONE;
}

int64_t rt_plan_classes(const Plan *p)
{
    int32_t x, y, logits = rt_plan_logits(p);
    if (logits == PLAN_NONE && !rt_data_inputs(p, &x, &y)) logits = loss_logits(p, y);
    const PlanTensor *lt = logits == PLAN_NONE ? NULL : &p->tensors[logits];
    return lt && lt->rank >= 1 ? lt->shape[lt->rank - 1] : 2;
}

/* ---- the values ops index with --------------------------------------------------------- */

static int32_t in_id(const Plan *p, int32_t k, int32_t i) { return p->ids[p->ops[k].in + i]; }

/* Op k's integer attribute `key`, or NULL. */
static const PlanAttr *op_int_attr(const Plan *p, int32_t k, const char *key)
{
    const PlanOp *op = &p->ops[k];
    for (int32_t a = 0; a < op->n_attr; a++) {
        const PlanAttr *at = &p->attrs[op->attr + a];
        if (at->kind == PLAN_ATTR_INT && !strcmp(plan_str(p, at->key), key)) return at;
    }
    return NULL;
}

/* Its value, or def. */
static int64_t op_int(const Plan *p, int32_t k, const char *key, int64_t def)
{
    const PlanAttr *at = op_int_attr(p, k, key);
    return at ? at->i : def;
}

int64_t rt_plan_valid_columns(const Plan *p, int64_t cols)
{
    for (int32_t k = 0; k < p->n_ops; k++) {
        OpKind kind = op_lookup(plan_str(p, p->ops[k].op));
        if (kind != OP_cross_entropy && kind != OP_cross_entropy_bwd && kind != OP_cross_entropy_fused) continue;
        const PlanTensor *lg = &p->tensors[in_id(p, k, 0)];
        int64_t valid = op_int(p, k, "valid", 0);
        if (valid > 0 && lg->rank && lg->shape[lg->rank - 1] == cols) return valid;
    }
    for (int32_t i = 0; i < p->n_tensors; i++)  // a program without the loss (decode): the padded param's own rows
        if (p->tensors[i].logical_rows && p->tensors[i].shape[0] == cols) return p->tensors[i].logical_rows;
    return cols;
}

int64_t rt_logits_valid(const Plan *p, int32_t t)
{
    const PlanTensor *x = &p->tensors[t];
    int64_t cols = x->rank ? x->shape[x->rank - 1] : 1;
    for (int32_t k = 0; k < p->n_ops; k++) {
        OpKind kind = op_lookup(plan_str(p, p->ops[k].op));
        int64_t valid = op_int(p, k, "valid", 0);
        int loss = kind == OP_cross_entropy || kind == OP_cross_entropy_fused;
        if (loss && in_id(p, k, 0) == t && valid > 0) return valid;
    }
    return cols;
}

RtIndexKind rt_op_index(const Plan *p, int32_t k, int32_t *idx, int64_t *bound)
{
    const PlanOp *op = &p->ops[k];
    OpKind kind = op_lookup(plan_str(p, op->op));
    if ((kind == OP_embedding || kind == OP_cross_entropy || kind == OP_cross_entropy_bwd ||
         kind == OP_cross_entropy_fused) && op->n_in >= 2) {
        const PlanTensor *a = &p->tensors[in_id(p, k, 0)];
        *idx = in_id(p, k, 1);
        /* A padded vocabulary's rows and columns are no token's (passes/pad_vocab.c). */
        *bound = kind == OP_embedding ? rt_plan_valid_columns(p, a->shape[0]) : op_int(p, k, "valid", 0);
        if (!*bound) *bound = a->shape[a->rank - 1];
        return kind == OP_embedding ? RT_INDEX_ROWS : RT_INDEX_CLASSES;
    }
    if ((kind == OP_embedding_bwd || kind == OP_embedding_bwd_into) && op->n_in >= 2 && op->n_out >= 1) {
        *idx = in_id(p, k, kind == OP_embedding_bwd_into);
        *bound = rt_plan_valid_columns(p, p->tensors[p->ids[op->out]].shape[0]);
        return RT_INDEX_ROWS;
    }
    return RT_INDEX_NONE;
}

int rt_op_index_sentinel(const Plan *p, int32_t k, int64_t *value)
{
    const PlanAttr *at = op_int_attr(p, k, "ignore_index");
    if (at) *value = at->i;
    return at != NULL;
}

int rt_op_copies_values(const char *op)
{
    OpKind kind = op_lookup(op);
    return kind != OP_COUNT && ((op_info(kind)->flags & (OPF_LAYOUT | OPF_VIEW)) || kind == OP_expand ||
                                kind == OP_all_gather);
}

/* The index reads input's values reach (see rt_input_bound): the least bound (op *by),
 * and in *sentinel the one value outside [0, bound) that every one of them allows
 * (*has: 1), if they agree on one. */
static int64_t index_reads(const Plan *p, int32_t input, int32_t *by, int *has, int64_t *sentinel)
{
    uint8_t *carries = plan_alloc((size_t)p->n_tensors + 1);
    if (!carries) return -1;
    for (int32_t i = 0; i < p->n_tensors; i++) carries[i] = is_data_input(&p->tensors[i]) && same_input(p, i, input);
    int64_t least = 0;
    int reads = 0;
    *by = PLAN_NONE, *has = 0;
    for (int32_t k = 0; k < p->n_ops; k++) {  // a program's ops are in issue order: makers before readers
        const PlanOp *op = &p->ops[k];
        int32_t idx;
        int64_t n, s;
        if (rt_op_index(p, k, &idx, &n) != RT_INDEX_NONE && carries[idx]) {
            if (!least || n < least) least = n, *by = k;
            int allows = rt_op_index_sentinel(p, k, &s);  // every read must allow the same one
            *has = reads++ ? *has && allows && s == *sentinel : allows;
            if (allows) *sentinel = s;
        }
        int carried = 0;
        for (int32_t i = 0; i < op->n_in && !carried; i++) carried = carries[in_id(p, k, i)];
        if (!carried || !rt_op_copies_values(plan_str(p, op->op))) continue;
        for (int32_t o = 0; o < op->n_out; o++) carries[p->ids[op->out + o]] = 1;
    }
    plan_dealloc(carries);
    return least;
}

int64_t rt_input_bound(const Plan *p, int32_t input, int32_t *by)
{
    int has;
    int64_t sentinel;
    return index_reads(p, input, by, &has, &sentinel);
}

int rt_input_ignored(const Plan *p, int32_t input, int64_t *value)
{
    int32_t by;
    int has = 0;
    return index_reads(p, input, &by, &has, value) > 0 && has;
}

int rt_input_sentinel(const Plan *p, int32_t input, int64_t *value)
{
    int32_t by;
    int has = 0;
    int64_t least = index_reads(p, input, &by, &has, value);
    return least > 0 && has && !(*value >= 0 && *value < least);  // inside the range: nothing to allow
}

/* The input of op `op` (by name) that is attention_masked's key mask, or -1. */
static int mask_slot(const char *op)
{
    OpKind kind = op_lookup(op);
    if (kind == OP_attention_qkv_masked || kind == OP_attention_qkv_masked_bwd) return 1;
    return kind == OP_attention_masked || kind == OP_attention_masked_bwd ? 3 : -1;
}

int rt_input_masks_only(const Plan *p, int32_t input)
{
    uint8_t *carries = plan_alloc((size_t)p->n_tensors + 1);
    if (!carries) return 0;
    for (int32_t i = 0; i < p->n_tensors; i++) carries[i] = is_data_input(&p->tensors[i]) && same_input(p, i, input);
    int masks = 0, other = 0;
    for (int32_t k = 0; k < p->n_ops && !other; k++) {  // makers before readers, as in index_reads
        const PlanOp *op = &p->ops[k];
        const char *name = plan_str(p, op->op);
        int carried = 0;
        for (int32_t i = 0; i < op->n_in; i++) {
            if (!carries[in_id(p, k, i)]) continue;
            if (i == mask_slot(name)) masks++;
            else carried = 1;
        }
        if (!carried) continue;
        if (!rt_op_copies_values(name) && strcmp(name, "cast")) other = 1;  // a cast keeps -inf
        for (int32_t o = 0; o < op->n_out; o++) carries[p->ids[op->out + o]] = 1;
    }
    plan_dealloc(carries);
    return masks > 0 && !other;
}
