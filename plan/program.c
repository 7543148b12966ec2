/* plan/program.c: plans of several programs, one per pipeline stage. The compiler builds
 * one plan per stage and appends each to the whole (plan_append_program); a rank runs
 * its stage's program alone, taken out again (plan_extract_program). The two are
 * inverses: an extracted program is the plan that was appended, field for field, but
 * for its string ids (an extract keeps the whole plan's string table) and its pools'
 * layout (an extract's ids hold each op's inputs and outputs in op order, then the CUDA
 * instructions' arguments; its attributes and lists follow its ops), which codegen's
 * plans already have.
 *
 * Appending moves every id of the program by where its ranges start in the whole plan:
 * op ids (a tensor's producer, live range and waits, an instruction's op) by the ops
 * before it, tensor ids by the tensors before it, pool ranges by the pools' lengths.
 * Blocks are the model's, the same in every stage, so block ids do not move.
 */
#include <stdio.h>
#include <string.h>

#include "plan.h"

/* ---- appending ------------------------------------------------------------------------ */

/* Where the appended program's items start in the whole plan. */
typedef struct {
    int32_t op, tensor, id, attr, num, wait;
    const int32_t *str;  // one's string id -> p's
} Base;

static int32_t moved(int32_t id, int32_t base) { return id == PLAN_NONE ? PLAN_NONE : id + base; }

static int append_meta(Plan *p, const Plan *one)
{
    for (int32_t i = 0; i < one->n_meta; i++) {
        const PlanMeta *m = &one->meta[i];
        const char *key = one->strs[m->key];
        int rc = m->kind == PLAN_META_STR ? plan_meta_set_str(p, key, one->strs[m->s])
                 : m->kind == PLAN_META_INT ? plan_meta_set_int(p, key, m->i)
                                            : plan_meta_set_float(p, key, m->f);
        if (rc) return -1;
    }
    for (int32_t i = 0; i < one->n_blocks; i++) {
        const PlanBlock *b = &one->blocks[i];
        if (plan_block_add(p, one->strs[b->name], one->strs[b->layer], b->index) < 0) return -1;
    }
    return 0;
}

static int same_blocks(const Plan *p, const Plan *one, char *err, size_t errlen)
{
    if (one->n_blocks != p->n_blocks)
        return plan_fail(err, errlen, "stage %d has %d blocks, the stages before it %d (every stage has the model's)",
                         p->n_programs, one->n_blocks, p->n_blocks);
    for (int32_t i = 0; i < p->n_blocks; i++) {
        const PlanBlock *a = &p->blocks[i], *b = &one->blocks[i];
        if (strcmp(p->strs[a->name], one->strs[b->name]) || strcmp(p->strs[a->layer], one->strs[b->layer]) ||
            a->index != b->index)
            return plan_fail(err, errlen, "stage %d: block %d is %s (%s %d), the stages before it have %s (%s %d)",
                             p->n_programs, i, one->strs[b->name], one->strs[b->layer], b->index, p->strs[a->name],
                             p->strs[a->layer], a->index);
    }
    return 0;
}

static int append_tensors(Plan *p, const Plan *one, const Base *b)
{
    for (int32_t i = 0; i < one->n_tensors; i++) {
        PlanTensor t = one->tensors[i];
        t.name = t.name == PLAN_NONE ? PLAN_NONE : b->str[t.name];
        t.producer = moved(t.producer, b->op);
        t.tied_to = moved(t.tied_to, b->tensor), t.grad = moved(t.grad, b->tensor), t.alias = moved(t.alias, b->tensor);
        t.live_start += b->op, t.live_end += b->op;
        if (plan_tensor_add(p, &t) < 0) return -1;
    }
    for (int32_t i = 0; i < one->n_outputs; i++)
        if (plan_output_add(p, one->outputs[i] + b->tensor) < 0) return -1;
    return 0;
}

/* The pools (ids, attributes, lists, waits), then the ops and CUDA instructions that
 * hold ranges of them. */
static int append_ops(Plan *p, const Plan *one, const Base *b)
{
    for (int32_t i = 0; i < one->n_ids; i++)
        if (plan_id_add(p, one->ids[i] + b->tensor) < 0) return -1;
    for (int32_t i = 0; i < one->n_ints; i++)
        if (plan_int_add(p, one->ints[i]) < 0) return -1;
    for (int32_t i = 0; i < one->n_attrs; i++) {
        PlanAttr a = one->attrs[i];
        a.key = b->str[a.key];
        if (a.kind == PLAN_ATTR_INTS) a.list += b->num;
        if (plan_attr_add(p, &a) < 0) return -1;
    }
    for (int32_t i = 0; i < one->n_waits; i++)
        if (plan_wait_add(p, one->waits[i] + b->op) < 0) return -1;
    for (int32_t i = 0; i < one->n_ops; i++) {
        PlanOp o = one->ops[i];
        o.op = b->str[o.op];
        o.in += b->id, o.out += b->id, o.attr += b->attr, o.wait += b->wait;
        if (plan_op_add(p, &o) < 0) return -1;
    }
    for (int32_t i = 0; i < one->n_cuda; i++) {
        PlanCuda c = one->cuda[i];
        c.op += b->op, c.args += b->id;
        c.kernel = c.kernel == PLAN_NONE ? PLAN_NONE : b->str[c.kernel];
        if (plan_cuda_add(p, &c) < 0) return -1;
    }
    return 0;
}

/* p's module, then one's. */
static int append_module(Plan *p, const Plan *one)
{
    size_t a = p->cuda_module ? strlen(p->cuda_module) : 0, n = one->cuda_module ? strlen(one->cuda_module) : 0;
    if (!n) return 0;
    char *text = plan_alloc(a + n + 1);
    if (!text) return -1;
    if (a) memcpy(text, p->cuda_module, a);
    memcpy(text + a, one->cuda_module, n + 1);
    plan_dealloc(p->cuda_module);
    p->cuda_module = text;
    return 0;
}

/* Adds the program (its ops, tensors and outputs join it as they are added) and its items. */
static int append_items(Plan *p, const Plan *one, int32_t *str)
{
    for (int32_t i = 0; i < one->n_strs; i++)
        if ((str[i] = plan_intern(p, one->strs[i])) < 0) return -1;
    if (!p->n_programs && append_meta(p, one)) return -1;
    PlanProgram g = one->programs[0];
    g.stage = p->n_programs;
    g.first_op = p->n_ops, g.first_tensor = p->n_tensors, g.first_output = p->n_outputs;
    g.n_ops = g.n_tensors = g.n_outputs = 0;
    g.module_at = p->cuda_module ? (int64_t)strlen(p->cuda_module) : 0;
    g.module_len = one->cuda_module ? (int64_t)strlen(one->cuda_module) : 0;
    Base b = {p->n_ops, p->n_tensors, p->n_ids, p->n_attrs, p->n_ints, p->n_waits, str};
    if (plan_program_add(p, &g) < 0 || append_tensors(p, one, &b) || append_ops(p, one, &b) || append_module(p, one))
        return -1;
    return 0;
}

int plan_append_program(Plan *p, const Plan *one, char *err, size_t errlen)
{
    int32_t k = p->n_programs;
    char why[256];
    if (one->n_programs != 1)
        return plan_fail(err, errlen, "stage %d: a plan of %d programs, expected one (a stage with its memory plan)", k,
                         one->n_programs);
    if (plan_check(one, why, sizeof why)) return plan_fail(err, errlen, "stage %d: %s", k, why);
    if (!k && (p->n_ops || p->n_tensors || p->n_outputs || p->n_cuda || p->cuda_module))
        return plan_fail(err, errlen, "stage 0: the plan appended to already holds ops, tensors, outputs or CUDA "
                         "code of no program; append to a new plan");
    if (k && same_blocks(p, one, err, errlen)) return -1;
    int32_t *str = plan_alloc(sizeof *str * (size_t)one->n_strs);
    int rc = !str || append_items(p, one, str);
    plan_dealloc(str);
    return rc ? plan_fail(err, errlen, "out of memory appending stage %d", k) : 0;
}

/* ---- extracting ------------------------------------------------------------------------ */

/* Gives arr room for n items (none for 0, as a new plan has); true when out of memory. */
#define ALLOC_FAILS(arr, n) ((n) && !((arr) = plan_alloc(sizeof *(arr) * (size_t)(n))))

/* The first CUDA instruction of an op at or after k (they are sorted by op). */
static int32_t first_cuda(const Plan *p, int32_t k)
{
    int32_t lo = 0, hi = p->n_cuda;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (p->cuda[mid].op < k) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The sizes of an extract's pools (count: -1 when one does not fit an int32, as ops
 * that share ranges of p's could make it). */
typedef struct {
    int64_t ids, attrs, ints, waits;
    int32_t cuda0, cuda1;  // p's instructions of the program's ops
} Sizes;

static int count(const Plan *p, const PlanProgram *g, Sizes *s)
{
    *s = (Sizes){0};
    for (int32_t k = g->first_op; k < g->first_op + g->n_ops; k++) {
        const PlanOp *o = &p->ops[k];
        s->ids += o->n_in + o->n_out, s->attrs += o->n_attr, s->waits += o->n_wait;
        for (int32_t a = 0; a < o->n_attr; a++)
            if (p->attrs[o->attr + a].kind == PLAN_ATTR_INTS) s->ints += p->attrs[o->attr + a].n_list;
    }
    s->cuda0 = first_cuda(p, g->first_op), s->cuda1 = first_cuda(p, g->first_op + g->n_ops);
    for (int32_t i = s->cuda0; i < s->cuda1; i++) s->ids += p->cuda[i].n_args;
    return s->ids > INT32_MAX || s->attrs > INT32_MAX || s->ints > INT32_MAX || s->waits > INT32_MAX ? -1 : 0;
}

/* Strings, meta and blocks as p's. */
static int copy_common(Plan *q, const Plan *p)
{
    if (ALLOC_FAILS(q->strs, p->n_strs)) return -1;
    for (int32_t i = 0; i < p->n_strs; i++) {
        size_t n = strlen(p->strs[i]);
        if (!(q->strs[i] = plan_alloc(n + 1))) return -1;
        memcpy(q->strs[i], p->strs[i], n + 1);
        q->n_strs++;
    }
    if (ALLOC_FAILS(q->meta, p->n_meta) || ALLOC_FAILS(q->blocks, p->n_blocks)) return -1;
    if (p->n_meta) memcpy(q->meta, p->meta, sizeof *q->meta * (size_t)p->n_meta);
    if (p->n_blocks) memcpy(q->blocks, p->blocks, sizeof *q->blocks * (size_t)p->n_blocks);
    q->n_meta = p->n_meta, q->n_blocks = p->n_blocks;
    return 0;
}

static void copy_tensors(Plan *q, const Plan *p, const PlanProgram *g)
{
    for (int32_t i = 0; i < g->n_tensors; i++) {
        PlanTensor t = p->tensors[g->first_tensor + i];
        t.producer = moved(t.producer, -g->first_op);
        t.tied_to = moved(t.tied_to, -g->first_tensor), t.grad = moved(t.grad, -g->first_tensor);
        t.alias = moved(t.alias, -g->first_tensor);
        t.live_start -= g->first_op, t.live_end -= g->first_op;
        q->tensors[q->n_tensors++] = t;
    }
    for (int32_t i = 0; i < g->n_outputs; i++) q->outputs[q->n_outputs++] = p->outputs[g->first_output + i] - g->first_tensor;
}

/* Appends n of p's tensor ids from ids[at], as q's; returns where they start. */
static int32_t copy_ids(Plan *q, const Plan *p, const PlanProgram *g, int32_t at, int32_t n)
{
    int32_t start = q->n_ids;
    for (int32_t i = 0; i < n; i++) q->ids[q->n_ids++] = p->ids[at + i] - g->first_tensor;
    return start;
}

static void copy_ops(Plan *q, const Plan *p, const PlanProgram *g, const Sizes *s)
{
    for (int32_t k = g->first_op; k < g->first_op + g->n_ops; k++) {
        PlanOp o = p->ops[k];
        o.in = copy_ids(q, p, g, o.in, o.n_in);
        o.out = copy_ids(q, p, g, o.out, o.n_out);
        int32_t attr = q->n_attrs;
        for (int32_t a = 0; a < o.n_attr; a++) {
            PlanAttr x = p->attrs[o.attr + a];
            if (x.kind == PLAN_ATTR_INTS) {
                int32_t list = q->n_ints;
                for (int32_t j = 0; j < x.n_list; j++) q->ints[q->n_ints++] = p->ints[x.list + j];
                x.list = list;
            }
            q->attrs[q->n_attrs++] = x;
        }
        o.attr = attr;
        int32_t wait = q->n_waits;
        for (int32_t w = 0; w < o.n_wait; w++) q->waits[q->n_waits++] = p->waits[o.wait + w] - g->first_op;
        o.wait = wait;
        q->ops[q->n_ops++] = o;
    }
    for (int32_t i = s->cuda0; i < s->cuda1; i++) {
        PlanCuda c = p->cuda[i];
        c.op -= g->first_op;
        c.args = copy_ids(q, p, g, c.args, c.n_args);
        q->cuda[q->n_cuda++] = c;
    }
}

/* q, a new plan, as program g of p alone; -1 when out of memory. */
static int extract(Plan *q, const Plan *p, const PlanProgram *g, const Sizes *s)
{
    if (copy_common(q, p) || ALLOC_FAILS(q->tensors, g->n_tensors) || ALLOC_FAILS(q->ops, g->n_ops) ||
        ALLOC_FAILS(q->outputs, g->n_outputs) || ALLOC_FAILS(q->ids, s->ids) || ALLOC_FAILS(q->attrs, s->attrs) ||
        ALLOC_FAILS(q->ints, s->ints) || ALLOC_FAILS(q->waits, s->waits) || ALLOC_FAILS(q->cuda, s->cuda1 - s->cuda0) ||
        ALLOC_FAILS(q->programs, 1) || ALLOC_FAILS(q->cuda_module, g->module_len ? g->module_len + 1 : 0))
        return -1;
    copy_tensors(q, p, g);
    copy_ops(q, p, g, s);
    if (q->cuda_module) {
        memcpy(q->cuda_module, p->cuda_module + g->module_at, (size_t)g->module_len);
        q->cuda_module[g->module_len] = 0;
    }
    PlanProgram one = *g;
    one.first_op = one.first_tensor = one.first_output = 0;
    one.module_at = 0;
    q->programs[q->n_programs++] = one;
    return 0;
}

Plan *plan_extract_program(const Plan *p, int32_t k, char *err, size_t errlen)
{
    if (k < 0 || k >= p->n_programs) {
        plan_fail(err, errlen, "no program %d to extract: the plan has %d", k, p->n_programs);
        return NULL;
    }
    Sizes s;
    if (count(p, &p->programs[k], &s)) {
        plan_fail(err, errlen, "program %d: its ops' tensor ids, attributes or waits, copied, exceed 2^31", k);
        return NULL;
    }
    Plan *q = plan_new();
    if (q && !extract(q, p, &p->programs[k], &s)) return q;
    plan_free(q);
    plan_fail(err, errlen, "out of memory extracting program %d", k);
    return NULL;
}
