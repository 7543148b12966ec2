/* plan/build.c: a Plan in memory: making one item by item (codegen does, through
 * plan_*_add), freeing it, and reading it back (strings, meta, names of the enums).
 *
 * Arrays grow by doubling through plan_alloc; strings are interned through an
 * open-addressing hash table that lives only while a plan is being built. Every add
 * either succeeds or leaves the plan as it was, so a failed allocation can be reported
 * and the plan freed without leaks.
 */
#include <string.h>

#include "plan.h"

struct PlanBuild {
    int32_t cap_strs, cap_meta, cap_blocks, cap_tensors, cap_ops, cap_ids, cap_attrs, cap_ints,
        cap_outputs, cap_cuda, cap_programs, cap_waits;
    int32_t *hash;  // string id + 1 per slot, 0 when empty; a power of two in size
    int32_t hash_cap;
};

Plan *plan_new(void)
{
    Plan *p = plan_alloc(sizeof *p);
    if (!p) return NULL;
    memset(p, 0, sizeof *p);
    p->major = PLAN_MAJOR;
    p->minor = PLAN_MINOR;
    return p;
}

void plan_free(Plan *p)
{
    if (!p) return;
    for (int32_t i = 0; i < p->n_strs; i++) plan_dealloc(p->strs[i]);
    plan_dealloc(p->strs);
    plan_dealloc(p->meta);
    plan_dealloc(p->blocks);
    plan_dealloc(p->tensors);
    plan_dealloc(p->ops);
    plan_dealloc(p->ids);
    plan_dealloc(p->attrs);
    plan_dealloc(p->ints);
    plan_dealloc(p->outputs);
    plan_dealloc(p->cuda);
    plan_dealloc(p->programs);
    plan_dealloc(p->waits);
    plan_dealloc(p->cuda_module);
    plan_dealloc(p->sections);
    plan_free(p->eval);
    plan_free(p->sample);
    plan_free(p->decode);
    if (p->build) plan_dealloc(p->build->hash);
    plan_dealloc(p->build);
    plan_dealloc(p);
}

/* ---- growth ----------------------------------------------------------------------- */

static struct PlanBuild *build_state(Plan *p)
{
    if (p->build) return p->build;
    struct PlanBuild *b = plan_alloc(sizeof *b);
    if (!b) return NULL;
    /* A plan that was read has arrays exactly as long as their counts. */
    *b = (struct PlanBuild){p->n_strs, p->n_meta, p->n_blocks, p->n_tensors, p->n_ops,
                            p->n_ids, p->n_attrs, p->n_ints, p->n_outputs, p->n_cuda, p->n_programs, p->n_waits, NULL, 0};
    return p->build = b;
}

/* Returns arr with room for one more item (n items of elem bytes, capacity *cap), or
 * NULL when out of memory (arr is then unchanged). */
static void *grow(void *arr, int32_t n, int32_t *cap, size_t elem)
{
    if (n < *cap) return arr;
    if (n >= INT32_MAX / 2) return NULL;
    int32_t ncap = *cap ? *cap * 2 : 16;
    if ((size_t)ncap > SIZE_MAX / elem) return NULL;
    void *na = plan_alloc((size_t)ncap * elem);
    if (!na) return NULL;
    if (n) memcpy(na, arr, (size_t)n * elem);
    plan_dealloc(arr);
    *cap = ncap;
    return na;
}

#define PUSH(p, field, count, capname, item)                                             \
    do {                                                                                 \
        struct PlanBuild *b_ = build_state(p);                                           \
        void *a_ = b_ ? grow((p)->field, (p)->count, &b_->capname, sizeof *(p)->field) : NULL; \
        if (!a_) return -1;                                                              \
        (p)->field = a_;                                                                 \
        (p)->field[(p)->count] = (item);                                                 \
        return (p)->count++;                                                             \
    } while (0)

/* ---- strings ---------------------------------------------------------------------- */

static uint32_t hash_str(const char *s)
{
    uint32_t h = 2166136261u;  // FNV-1a
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static int32_t *hash_slot(const Plan *p, const char *s)
{
    const struct PlanBuild *b = p->build;
    uint32_t mask = (uint32_t)b->hash_cap - 1;
    for (uint32_t i = hash_str(s) & mask;; i = (i + 1) & mask) {
        int32_t *slot = &b->hash[i];
        if (!*slot || !strcmp(p->strs[*slot - 1], s)) return slot;
    }
}

/* Keeps the table at most half full, so lookups end at an empty slot. */
static int hash_reserve(Plan *p, int32_t n)
{
    struct PlanBuild *b = p->build;
    if (b->hash && n <= b->hash_cap / 2) return 0;
    int32_t cap = b->hash_cap ? b->hash_cap : 64;
    while (n > cap / 2) {
        if (cap >= INT32_MAX / 4) return -1;
        cap *= 2;
    }
    int32_t *h = plan_alloc(sizeof *h * (size_t)cap);
    if (!h) return -1;
    memset(h, 0, sizeof *h * (size_t)cap);
    plan_dealloc(b->hash);
    b->hash = h;
    b->hash_cap = cap;
    for (int32_t i = 0; i < p->n_strs; i++) {
        int32_t *slot = hash_slot(p, p->strs[i]);
        if (!*slot) *slot = i + 1;
    }
    return 0;
}

int32_t plan_intern(Plan *p, const char *s)
{
    struct PlanBuild *b = build_state(p);
    if (!b || hash_reserve(p, p->n_strs + 1)) return -1;
    int32_t *slot = hash_slot(p, s);
    if (*slot) return *slot - 1;
    size_t n = strlen(s);
    char *copy = plan_alloc(n + 1);
    if (!copy) return -1;
    memcpy(copy, s, n + 1);
    char **strs = grow(p->strs, p->n_strs, &b->cap_strs, sizeof *p->strs);
    if (!strs) {
        plan_dealloc(copy);
        return -1;
    }
    p->strs = strs;
    p->strs[p->n_strs] = copy;
    *slot = p->n_strs + 1;
    return p->n_strs++;
}

const char *plan_str(const Plan *p, int32_t id)
{
    return id >= 0 && id < p->n_strs ? p->strs[id] : "";
}

/* ---- items ------------------------------------------------------------------------ */

static int meta_set(Plan *p, const char *key, PlanMeta m)
{
    m.key = plan_intern(p, key);
    if (m.key < 0) return -1;
    for (int32_t i = 0; i < p->n_meta; i++)
        if (p->meta[i].key == m.key) {
            p->meta[i] = m;
            return 0;
        }
    struct PlanBuild *b = build_state(p);
    PlanMeta *meta = b ? grow(p->meta, p->n_meta, &b->cap_meta, sizeof *p->meta) : NULL;
    if (!meta) return -1;
    p->meta = meta;
    p->meta[p->n_meta++] = m;
    return 0;
}

int plan_meta_set_str(Plan *p, const char *key, const char *value)
{
    int32_t s = plan_intern(p, value);
    return s < 0 ? -1 : meta_set(p, key, (PlanMeta){.kind = PLAN_META_STR, .s = s});
}

int plan_meta_set_int(Plan *p, const char *key, int64_t value)
{
    return meta_set(p, key, (PlanMeta){.kind = PLAN_META_INT, .s = PLAN_NONE, .i = value});
}

int plan_meta_set_float(Plan *p, const char *key, double value)
{
    return meta_set(p, key, (PlanMeta){.kind = PLAN_META_FLOAT, .s = PLAN_NONE, .f = value});
}

int32_t plan_block_add(Plan *p, const char *name, const char *layer, int32_t index)
{
    int32_t n = plan_intern(p, name), l = plan_intern(p, layer);
    if (n < 0 || l < 0) return -1;
    PUSH(p, blocks, n_blocks, cap_blocks, ((PlanBlock){n, l, index}));
}

static int32_t push_tensor(Plan *p, const PlanTensor *t) { PUSH(p, tensors, n_tensors, cap_tensors, *t); }
static int32_t push_op(Plan *p, const PlanOp *op) { PUSH(p, ops, n_ops, cap_ops, *op); }
static int32_t push_output(Plan *p, int32_t tensor) { PUSH(p, outputs, n_outputs, cap_outputs, tensor); }

/* An op, tensor or output added where the last program's range of its kind ends joins
 * that program: a plan grows after plan_set_one_program, and plan_append_program grows
 * the program it has just added. */
static int32_t join_last(int32_t id, const int32_t *first, int32_t *n)
{
    if (id >= 0 && *first + *n == id) (*n)++;
    return id;
}
#define LAST(p) (&(p)->programs[(p)->n_programs - 1])

int32_t plan_tensor_add(Plan *p, const PlanTensor *t)
{
    int32_t id = push_tensor(p, t);
    return p->n_programs ? join_last(id, &LAST(p)->first_tensor, &LAST(p)->n_tensors) : id;
}
int32_t plan_op_add(Plan *p, const PlanOp *op)
{
    int32_t id = push_op(p, op);
    return p->n_programs ? join_last(id, &LAST(p)->first_op, &LAST(p)->n_ops) : id;
}
int32_t plan_output_add(Plan *p, int32_t tensor)
{
    int32_t id = push_output(p, tensor);
    return p->n_programs ? join_last(id, &LAST(p)->first_output, &LAST(p)->n_outputs) : id;
}
int32_t plan_id_add(Plan *p, int32_t id) { PUSH(p, ids, n_ids, cap_ids, id); }
int32_t plan_int_add(Plan *p, int64_t v) { PUSH(p, ints, n_ints, cap_ints, v); }
int32_t plan_attr_add(Plan *p, const PlanAttr *a) { PUSH(p, attrs, n_attrs, cap_attrs, *a); }
int32_t plan_cuda_add(Plan *p, const PlanCuda *c) { PUSH(p, cuda, n_cuda, cap_cuda, *c); }
int32_t plan_program_add(Plan *p, const PlanProgram *prog) { PUSH(p, programs, n_programs, cap_programs, *prog); }
int32_t plan_wait_add(Plan *p, int32_t op) { PUSH(p, waits, n_waits, cap_waits, op); }

int plan_set_one_program(Plan *p, int32_t dp_world, int64_t device_bytes, int64_t host_bytes)
{
    PlanProgram prog = {.stage = 0, .dp_world = dp_world, .first_op = 0, .n_ops = p->n_ops, .first_tensor = 0,
                        .n_tensors = p->n_tensors, .first_output = 0, .n_outputs = p->n_outputs, .module_at = 0,
                        .module_len = p->cuda_module ? (int64_t)strlen(p->cuda_module) : 0};
    prog.space_bytes[PLAN_PLACE_DEVICE] = device_bytes;
    prog.space_bytes[PLAN_PLACE_HOST] = host_bytes;
    if (p->n_programs) {
        p->programs[0] = prog;
        p->n_programs = 1;
        return 0;
    }
    return plan_program_add(p, &prog) < 0 ? -1 : 0;
}

int plan_set_cuda_module(Plan *p, const char *text)
{
    size_t n = strlen(text);
    char *copy = plan_alloc(n + 1);
    if (!copy) return -1;
    memcpy(copy, text, n + 1);
    plan_dealloc(p->cuda_module);
    p->cuda_module = copy;
    if (p->n_programs == 1) p->programs[0].module_at = 0, p->programs[0].module_len = (int64_t)n;
    return 0;
}

/* ---- reading ---------------------------------------------------------------------- */

const PlanMeta *plan_meta_find(const Plan *p, const char *key)
{
    for (int32_t i = p->n_meta - 1; i >= 0; i--)
        if (!strcmp(plan_str(p, p->meta[i].key), key)) return &p->meta[i];
    return NULL;
}

const char *plan_meta_str(const Plan *p, const char *key, const char *def)
{
    const PlanMeta *m = plan_meta_find(p, key);
    return m && m->kind == PLAN_META_STR ? plan_str(p, m->s) : def;
}

int64_t plan_meta_int(const Plan *p, const char *key, int64_t def)
{
    const PlanMeta *m = plan_meta_find(p, key);
    return m && m->kind == PLAN_META_INT ? m->i : def;
}

double plan_meta_float(const Plan *p, const char *key, double def)
{
    const PlanMeta *m = plan_meta_find(p, key);
    return m && m->kind == PLAN_META_FLOAT ? m->f : m && m->kind == PLAN_META_INT ? (double)m->i : def;
}

#define NAME_OF(table, i) ((unsigned)(i) < sizeof table / sizeof *table ? table[i] : "?")

static const char *const DTYPES[PLAN_DT_COUNT] = {"f32", "f16", "bf16", "i32"};
static const int DTYPE_SIZES[PLAN_DT_COUNT] = {4, 2, 2, 4};
static const char *const ROLES[PLAN_ROLE_COUNT] = {"input", "param", "grad", "act", "opt_state",
                                                   "master", "comm", "scratch", "const", "gathered", "kv_cache",
                                                   "param16"};
static const char *const PLACES[PLAN_PLACE_COUNT] = {"device", "host"};
static const char *const PHASES[PLAN_PHASE_COUNT] = {"forward", "backward", "recompute",
                                                     "optimizer", "comm", "backward_weight"};
static const char *const STREAMS[PLAN_STREAM_COUNT] = {"compute", "collective", "copy"};
static const char *const STEP_ROLES[PLAN_SR_COUNT] = {"none", "loss", "lr", "grad_norm", "loss_scale",
                                                      "step", "opt_step", "loss_seed", "rng", "pos"};
static const char *const INITS[PLAN_INIT_COUNT] = {"none", "zeros", "ones", "normal", "uniform", "full"};
static const char *const EPILOGUES[PLAN_EPI_COUNT] = {"none",        "bias",    "gelu_aux_bias",
                                                      "dgelu_bgrad", "bgrad_a", "bgrad_b"};

const char *plan_dtype_name(PlanDType t) { return NAME_OF(DTYPES, t); }
int plan_dtype_size(PlanDType t) { return (unsigned)t < PLAN_DT_COUNT ? DTYPE_SIZES[t] : 0; }
const char *plan_role_name(PlanRole r) { return NAME_OF(ROLES, r); }
const char *plan_place_name(PlanPlace p) { return NAME_OF(PLACES, p); }
const char *plan_phase_name(PlanPhase p) { return NAME_OF(PHASES, p); }
const char *plan_init_name(PlanInit k) { return NAME_OF(INITS, k); }
const char *plan_epilogue_name(int e) { return NAME_OF(EPILOGUES, e); }
const char *plan_stream_name(PlanStream s) { return NAME_OF(STREAMS, s); }
const char *plan_step_role_name(PlanStepRole r) { return NAME_OF(STEP_ROLES, r); }

int32_t plan_role_tensor(const Plan *p, PlanStepRole r)
{
    for (int32_t i = 0; i < p->n_tensors && r != PLAN_SR_NONE; i++)
        if (p->tensors[i].step_role == r) return i;
    return PLAN_NONE;
}

int64_t plan_space_bytes(const Plan *p, PlanPlace s)
{
    return p->n_programs > 0 && (unsigned)s < PLAN_PLACE_COUNT ? p->programs[0].space_bytes[s] : -1;
}

int64_t plan_tensor_numel(const PlanTensor *t)
{
    uint64_t n = 1;
    for (int32_t i = 0; i < t->rank && i < PLAN_MAX_RANK; i++) n *= (uint64_t)t->shape[i];
    return (int64_t)n;
}

int64_t plan_tensor_nbytes(const PlanTensor *t)
{
    return (int64_t)((uint64_t)plan_tensor_numel(t) * (uint64_t)plan_dtype_size(t->dtype));
}

int64_t plan_tensor_logical_numel(const PlanTensor *t)
{
    int64_t n = plan_tensor_numel(t);
    return t->logical_rows && t->rank && t->shape[0] ? n / t->shape[0] * t->logical_rows : n;
}

void plan_tensor_logical_shape(const PlanTensor *t, int64_t *shape)
{
    for (int32_t d = 0; d < PLAN_MAX_RANK; d++) shape[d] = d < t->rank ? t->shape[d] : 0;
    if (t->logical_rows && t->rank) shape[0] = t->logical_rows;
}

int plan_tensor_is_persistent(const PlanTensor *t)
{
    return t->role == PLAN_ROLE_PARAM || t->role == PLAN_ROLE_OPT_STATE || t->role == PLAN_ROLE_MASTER ||
           t->role == PLAN_ROLE_INPUT || t->role == PLAN_ROLE_PARAM16;
}

const char *plan_tensor_label(const Plan *p, int32_t id)
{
    const char *s = plan_str(p, p->tensors[id].name);
    return *s ? s : "(unnamed)";
}

int plan_tensor_is_model_param(const PlanTensor *t)
{
    int storage = t->unit != PLAN_NONE && t->alias == PLAN_NONE;
    return t->role == PLAN_ROLE_PARAM && t->tied_to == PLAN_NONE && t->name != PLAN_NONE && !storage;
}
