/* report/memstate.c: model state per rank as ZeRO counts it (Rajbhandari et al., "ZeRO:
 * Memory Optimizations Toward Training Trillion Parameter Models"), from the plan alone.
 * Under mixed precision ZeRO counts 2 Psi of 16-bit params, 2 Psi of 16-bit grads and
 * K Psi of optimizer state, K = 12 for AdamW (the fp32 master 4 Psi, momentum and
 * variance 8 Psi: here fp32 params and optimizer state); ZeRO-1 shards the K part,
 * ZeRO-2 the grads too, ZeRO-3 the params as well (16 Psi / N). In fp32 the params are
 * the masters and the grads are fp32: 4 + 4 + 8 Psi.
 *
 * What each category holds, each buffer counted once per rank:
 *  - A param copy is a root made by a cast, a host-device copy or a gather of a param
 *    (its storage, or its view into one) or of another copy; copy_of names the param
 *    (the view a cast reads, the storage a gather's shard was cast from). It is its
 *    dtype's params, whatever made it: 16-bit params are the casts a ddp or unsharded
 *    16-bit plan makes in the forward, zero1 and zero2's gathers, offload's device
 *    copies, and the 16-bit params an update writes and keeps between steps
 *    (cast_in_update, role param16: a copy of the master it updates). Model state
 *    counts a param's copies once, as the largest (a gather holds the shard cast to
 *    send it, a recompute's cast is the forward's again), in the
 *    device space when one is there (offload casts on the host only to send it over).
 *  - fsdp gathers a block's params before each use (its forward, and again its backward
 *    under reshard_after_forward) and frees them after: several gathers of the same
 *    params, working buffers like activations ("gathered params", transient, not model
 *    state), so an fsdp unit's 16-bit params are the 16-bit shard its gathers send:
 *    ZeRO-3's 2 Psi / N, which the update writes and keeps (or, with cast_in_update 0,
 *    the plan casts from the fp32 shard before each gather). Params gathered once a step are kept for it: zero1's and
 *    zero2's (2 Psi), and fsdp's params outside blocks (kept from forward to backward,
 *    like FairScale's root instance) or every unit's under reshard_after_forward 0.
 *  - Grads: every gradient buffer by dtype, but the full buffer a reduce-scatter reads
 *    (zero2's and fsdp's bucket for a unit, and the 16-bit gradients cast into it under
 *    reduce_dtype fp32: working memory; this rank's shard that it leaves is the state) and a partial sum that an
 *    add sums into another gradient (gradient accumulation's later micro-batches); in an
 *    unsharded 16-bit plan also the 16-bit gradients that casts make the fp32 ones of
 *    (the optimizer reads 16-bit gradients as they are, so these are accumulation's
 *    and reduce_dtype fp32's). fp32 grads in a 16-bit plan (summed or reduced in fp32)
 *    are what ZeRO's (2 + 2 + K) Psi leaves out: the report shows them apart.
 *    A gradient copied to the host (offload, where the optimizer reads it) counts once,
 *    as its copy there; one sent to another pipeline stage (a tied param's partial sum)
 *    counts where it is summed.
 *  - fp32 params: the fp32 storage and master weights. Optimizer state: its buffers and
 *    scalars (the step count, the fp16 loss scale).
 */
#include <string.h>

#include "report.h"

int64_t report_buffer_bytes(const Plan *p, int32_t t)
{
    int64_t cap = INT64_MAX / 4 / ((int64_t)p->n_tensors + 1), n = plan_tensor_nbytes(&p->tensors[t]);
    return n > cap ? cap : n;
}

static int is_16bit(PlanDType d) { return d == PLAN_DT_F16 || d == PLAN_DT_BF16; }

static MemCategory by_width(PlanDType d, MemCategory c16, MemCategory c32) { return is_16bit(d) ? c16 : c32; }

int report_state_category(MemCategory c) { return c >= MEM_PARAMS16 && c <= MEM_OPT_STATE; }

int64_t report_state_sum(const int64_t *state)
{
    int64_t sum = 0;
    for (int c = MEM_PARAMS16; c <= MEM_OPT_STATE; c++) sum += state[c];
    return sum;
}

static int is_cast(const Plan *p, int32_t op)
{
    return op >= 0 && op < p->n_ops && op_lookup(plan_str(p, p->ops[op].op)) == OP_cast;
}

/* Whether op makes a copy of its input: a cast, a host-device copy, a gather. */
static int makes_copy(const Plan *p, const PlanOp *op, OpComm kind)
{
    if (op->n_in < 1 || op->n_out < 1) return 0;
    return kind == COMM_ALL_GATHER || kind == COMM_TO_DEVICE || is_cast(p, (int32_t)(op - p->ops));
}

/* The param tensor t holds a copy of: t itself when it is a param (a tied one: the param
 * it sees), the param of the copy it lies in, or PLAN_NONE. */
static int32_t param_of(const MemReport *r, int32_t t)
{
    const PlanTensor *x = &r->plan->tensors[t];
    if (x->role == PLAN_ROLE_PARAM) return x->tied_to != PLAN_NONE ? x->tied_to : t;
    return r->copy_of[r->root[t]];
}

/* A reduce-scatter's input gradient, and the gradient it is a cast of (reduce_dtype
 * fp32 under mixed precision): the bucket. */
static void mark_bucket(MemReport *r, int32_t g)
{
    const Plan *p = r->plan;
    r->marks[g] |= MEM_MARK_BUCKET;
    int32_t made = p->tensors[g].producer;
    if (!is_cast(p, made) || p->ops[made].n_in < 1) return;
    int32_t src = r->root[p->ids[p->ops[made].in]];
    if (p->tensors[src].role == PLAN_ROLE_GRAD) r->marks[src] |= MEM_MARK_BUCKET;
}

/* What the op tells of its input and output roots: a reduce-scatter's bucket, an
 * unsharded plan's 16-bit gradient, a copy of a param (gathers counted in *gathers). */
static void mark_op(MemReport *r, const PlanOp *op, int32_t *gathers)
{
    const Plan *p = r->plan;
    OpComm kind = report_op_comm(p, op);
    int32_t in = p->ids[op->in], rin = r->root[in];
    const PlanTensor *x = &p->tensors[rin];
    if (kind == COMM_REDUCE_SCATTER && x->role == PLAN_ROLE_GRAD) mark_bucket(r, rin);
    if ((kind == COMM_TO_HOST || kind == COMM_SEND) && x->role == PLAN_ROLE_GRAD) r->marks[rin] |= MEM_MARK_SENT;
    if (!makes_copy(p, op, kind)) return;
    int32_t out = p->ids[op->out];
    const PlanTensor *y = &p->tensors[r->root[out]];
    if (kind == COMM_NONE && y->role == PLAN_ROLE_GRAD && x->role != PLAN_ROLE_GRAD && is_16bit(x->dtype))
        r->marks[rin] |= MEM_MARK_GRAD16;
    int32_t src = param_of(r, in);
    /* A copy into part of a buffer (offload's device params, which zero1 and zero2 then
     * gather in place) copies into that buffer; an in-place gather into the param's own
     * storage (zero1, zero2 in fp32) makes no copy. */
    int32_t dst = p->tensors[out].alias != PLAN_NONE ? r->root[out] : out;
    if (src == PLAN_NONE || r->copy_of[dst] != PLAN_NONE) return;
    if (dst != out && p->tensors[dst].role != PLAN_ROLE_GATHERED) return;
    r->copy_of[dst] = src;
    if (kind == COMM_ALL_GATHER) gathers[src]++;
}

/* Gradients that an add sums into another gradient buffer (a later micro-batch's under
 * gradient accumulation, a tied param's part from another stage): partial sums, working
 * memory; the sum is the state. The 16-bit gradients cast into a partial sum or into a
 * bucket (reduce_dtype fp32) are working memory with it. */
static void mark_partials(MemReport *r)
{
    const Plan *p = r->plan;
    for (int32_t k = 0; k < p->n_ops; k++) {
        const PlanOp *op = &p->ops[k];
        if (op->n_out < 1 || op_lookup(plan_str(p, op->op)) != OP_add) continue;
        int32_t sum = r->root[p->ids[op->out]];
        if (p->tensors[sum].role != PLAN_ROLE_GRAD) continue;
        for (int32_t i = 0; i < op->n_in; i++) {
            int32_t part = r->root[p->ids[op->in + i]];
            if (part != sum && p->tensors[part].role == PLAN_ROLE_GRAD) r->marks[part] |= MEM_MARK_PARTIAL;
        }
    }
    for (int32_t k = 0; k < p->n_ops; k++) {
        const PlanOp *op = &p->ops[k];
        if (op->n_in < 1 || op->n_out < 1 || !is_cast(p, k)) continue;
        int32_t from = r->root[p->ids[op->in]], to = r->root[p->ids[op->out]];
        if (r->marks[from] & MEM_MARK_GRAD16) r->marks[from] |= r->marks[to] & (MEM_MARK_PARTIAL | MEM_MARK_BUCKET);
    }
}

int report_state_marks(MemReport *r)
{
    const Plan *p = r->plan;
    size_t n = (size_t)p->n_tensors + 1;
    int32_t *gathers = plan_alloc(sizeof *gathers * n);
    if (!gathers) return -1;
    memset(gathers, 0, sizeof *gathers * n);
    memset(r->marks, 0, n);
    for (int32_t t = 0; t < p->n_tensors; t++) r->copy_of[t] = PLAN_NONE;
    /* The 16-bit params an update writes (cast_in_update) are a copy of the master it
     * updates, which the step's gathers read before the update runs: marked first. */
    for (int32_t k = 0; k < p->n_ops; k++) {
        const PlanOp *op = &p->ops[k];
        int at = ops_update_copy_input(op_lookup(plan_str(p, op->op)));
        if (at >= 0 && at < op->n_in) r->copy_of[r->root[p->ids[op->in + at]]] = param_of(r, p->ids[op->in]);
    }
    /* In op order, so a copy of a copy (offload's host cast sent to the device) finds
     * the param of the one before. */
    for (int32_t k = 0; k < p->n_ops; k++)
        if (p->ops[k].n_in >= 1) mark_op(r, &p->ops[k], gathers);
    mark_partials(r);
    /* A forward-only program (evaluation, sampling) uses each gather once and frees it:
     * working memory, whatever the strategy. */
    int forward_only = 1;
    for (int32_t k = 0; k < p->n_ops && forward_only; k++) forward_only = p->ops[k].phase != PLAN_PHASE_BACKWARD;
    for (int32_t t = 0; t < p->n_tensors; t++) {
        int32_t src = r->copy_of[t], made = p->tensors[t].producer;
        if (src != PLAN_NONE && (gathers[src] > 1 || forward_only) && made >= 0 && made < p->n_ops &&
            report_op_comm(p, &p->ops[made]) == COMM_ALL_GATHER)
            r->marks[t] |= MEM_MARK_PER_USE;
    }
    plan_dealloc(gathers);
    return 0;
}

MemCategory report_category_of(const MemReport *r, int32_t t)
{
    const PlanTensor *x = &r->plan->tensors[t];
    if (r->copy_of[t] != PLAN_NONE)
        return r->marks[t] & MEM_MARK_PER_USE ? MEM_GATHERED : by_width(x->dtype, MEM_PARAMS16, MEM_PARAMS32);
    if (r->marks[t] & MEM_MARK_GRAD16) return MEM_GRADS16;
    switch (x->role) {
    case PLAN_ROLE_INPUT: return MEM_INPUTS;
    case PLAN_ROLE_PARAM:
    case PLAN_ROLE_MASTER: return by_width(x->dtype, MEM_PARAMS16, MEM_PARAMS32);
    case PLAN_ROLE_GRAD: return by_width(x->dtype, MEM_GRADS16, MEM_GRADS32);
    case PLAN_ROLE_OPT_STATE: return MEM_OPT_STATE;
    case PLAN_ROLE_COMM: return MEM_COMM;
    case PLAN_ROLE_SCRATCH: return MEM_SCRATCH;
    case PLAN_ROLE_CONST: return MEM_CONSTS;
    case PLAN_ROLE_GATHERED: return MEM_GATHERED;
    case PLAN_ROLE_KV_CACHE: return MEM_KV_CACHE;
    case PLAN_ROLE_PARAM16: return by_width(x->dtype, MEM_PARAMS16, MEM_PARAMS32);
    case PLAN_ROLE_ACT:
    case PLAN_ROLE_COUNT: break;
    }
    return MEM_ACTS;
}

/* The largest copy of one param in one space, of one width (16-bit, fp32). */
typedef struct {
    int64_t bytes;
    PlanDType dtype;
} Copy;

static void add(MemReport *r, PlanPlace pl, MemCategory c, int64_t bytes, PlanDType d)
{
    (pl == PLAN_PLACE_HOST ? r->host_state : r->state)[c] += bytes;
    if ((c == MEM_PARAMS16 || c == MEM_PARAMS32) && (unsigned)d < PLAN_DT_COUNT) r->param_dtype[pl][d] += bytes;
}

/* Each param's copies of a width: the largest, on the device when it has one there. */
static void add_copies(MemReport *r, const Copy *best, int32_t n)
{
    for (int32_t src = 0; src < n; src++)
        for (int w = 0; w < 2; w++) {
            const Copy *dev = &best[(src * 2 + w) * PLAN_PLACE_COUNT + PLAN_PLACE_DEVICE];
            const Copy *host = &best[(src * 2 + w) * PLAN_PLACE_COUNT + PLAN_PLACE_HOST];
            const Copy *c = dev->bytes ? dev : host;
            if (c->bytes) add(r, dev->bytes ? PLAN_PLACE_DEVICE : PLAN_PLACE_HOST, w ? MEM_PARAMS32 : MEM_PARAMS16,
                              c->bytes, c->dtype);
        }
}

int report_state_totals(MemReport *r)
{
    const Plan *p = r->plan;
    size_t n = ((size_t)p->n_tensors + 1) * 2 * PLAN_PLACE_COUNT;
    Copy *best = plan_alloc(sizeof *best * n);
    if (!best) return -1;
    memset(best, 0, sizeof *best * n);
    for (int32_t t = 0; t < p->n_tensors; t++) {
        const PlanTensor *x = &p->tensors[t];
        MemCategory c = (MemCategory)r->cat[t];
        if (x->alias != PLAN_NONE || r->root[t] != t) continue;
        if (c == MEM_GATHERED) r->has_per_use_gathers = 1;
        if (!report_state_category(c) || (r->marks[t] & (MEM_MARK_BUCKET | MEM_MARK_SENT | MEM_MARK_PARTIAL))) continue;
        int64_t b = report_buffer_bytes(p, t);
        if (r->copy_of[t] == PLAN_NONE) {
            add(r, x->place, c, b, x->dtype);
            continue;
        }
        Copy *e = &best[((size_t)r->copy_of[t] * 2 + (c == MEM_PARAMS32)) * PLAN_PLACE_COUNT + x->place];
        if (b > e->bytes) e->bytes = b, e->dtype = x->dtype;
    }
    add_copies(r, best, p->n_tensors);
    plan_dealloc(best);
    return 0;
}
