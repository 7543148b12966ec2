/* runtime/exec.c: the executor of one rank, on the CPU backend.
 *
 * rt_exec_new does all the work a step could need up front: it allocates the rank's
 * arenas once, one per memory space (exactly the program's space_bytes, through the plan
 * layer's allocation hook; the host space is its own allocation, so a copy between the
 * spaces is a real copy), checks that every tensor lies inside its space's arena,
 * resolves every op to its kernel by name, and fills one KCall per op (pointers = its
 * space's arena + offset, shapes, attributes by signature
 * position, defaults for absent ones). The step loop then only writes the step number
 * and calls kernels in plan order: nothing allocates, nothing is looked up.
 *
 * Kernels get one more buffer, the workspace (kernels.h): f32 room for 16-bit calls
 * (matmul's converted panels, staged rows and slabs), the CPU analogue of cuBLAS's
 * workspace. It is allocated here once, as large as the neediest call's least need and
 * otherwise as large as the largest call can use, up to WORK_CAP floats; every call
 * shares it (calls run one at a time). An all-f32 plan has none.
 *
 * Some runs of ops go to the kernels as one parallel region each (batch.c: a fused
 * group, consecutive AdamW updates), with the bits of the ops run
 * one by one; not under the debug modes, which look at each op as it ends, nor with
 * ExecOptions.one_by_one. A traced run's span is its first op's; the others last 0.
 *
 * Views (OPF_VIEW ops whose output lies in its input's bytes: a reshape, a slice_view)
 * are skipped: the bytes are already where the output says. Effect ops (adamw, sgd) have no outputs and update
 * their inputs in place. A tensor with a rank_stride lies at offset + rank * rank_stride
 * (this rank's shard of a flat buffer); a view lies inside its root's bytes, for every
 * rank of the world.
 *
 * Collectives (OPF_COLLECTIVE) of a world of one are the kernels of cpu/comm_local.c; in
 * a larger world they run through MPI (comm.c), nonblocking: started when reached (the
 * collective stream of the plan's schedule), tested between ops so they progress, and
 * waited for where the schedule says: before an op, each collective its wait list names
 * (passes/schedule.c decided them; memplan kept their buffers until then). Nothing here
 * looks for hazards. Every collective is complete when a run returns. (One the schedule
 * left on the compute stream is waited for at once, as that stream's order says.)
 *
 * A pipeline stage (ExecOptions.whole, stage): the Exec runs its stage's program alone
 * (plan_extract_program), as data-parallel index `rank` of `world`. A collective's group
 * says over which ranks it runs (group 0: the stage's data-parallel ranks; group 1: the
 * stages) and its world must be that group's size. Point-to-point ops (OPF_P2P) go the
 * same way as collectives, on MPI only: a send or recv binds to the rank of stage `peer`
 * at this rank's data-parallel index, started when reached and waited for where the
 * wait lists say; their CPU kernels are never called.
 *
 * Persistent tensors (params, optimizer state, master weights, inputs) and any other
 * tensor no op produces are initialized here: from their init kind (rt_init_param,
 * keyed by name, so the values do not depend on the layout), zeros by default; a flat
 * storage from the params of its unit (rt_flat_init), its part on this rank.
 *
 * Debug mode (nan_fill): the arena starts as all-ones bytes (NaN in every float dtype,
 * -1 in i32) except what is initialized, and after each op every buffer whose live
 * range ends there is filled again, so a plan that reads a buffer after its last planned
 * use produces NaN instead of a silently plausible number.
 *
 * The plan must outlive the Exec: list attributes point into it.
 */
#include <stdio.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#include <cblas.h>

#include "batch.h"
#include "ops.h"
#include "kernels.h"
#include "runtime.h"

enum { ARENA_ALIGN = 64 };
#define WORK_CAP ((size_t)8 << 20)  // workspace floats (32 MiB) beyond which calls work in pieces

typedef struct {
    CpuKernel fn;
    KCall call;
    unsigned phase_bit;
    int skip;               // a view: nothing to compute
    int32_t dead, n_dead;   // range in Exec.dead: buffers whose life ends after this op
    int32_t wait, n_wait;   // range in plan->waits: the ops to complete first (the schedule)
    RtColl *coll;           // the collective or point-to-point op this is on MPI, else NULL
    int block;              // coll, which the schedule left on the compute stream: done before the next op
    int copy;               // a copy between the spaces: 1 + its direction (0 to the host, 1 to the device), else 0
    int64_t copy_bytes;     // ... and the bytes it moves
} ExecOp;

struct Exec {
    const Plan *plan;
    void *block[PLAN_PLACE_COUNT];    // what plan_alloc returned, per memory space
    uint8_t *space[PLAN_PLACE_COUNT]; // each space's arena: its block, rounded up to ARENA_ALIGN
    int64_t space_bytes[PLAN_PLACE_COUNT];
    ExecOp *ops;
    int32_t n_ops;
    int32_t *dead;          // tensor ids, grouped by the op after which they die
    int32_t *step;          // the "step" input, or NULL
    int32_t *rng;           // dropout's RNG words (PLAN_SR_RNG): seed low, seed high, step, rank; or NULL
    int nan_fill;
    int rank, world;        // the data-parallel index and ranks of this stage
    int shard, shard_rank;  // the ranks a shard is split over (hybrid sharding's S; else world) and this
                            // rank's index among them, rank % shard: the rank of every view's rank_stride
    const Plan *whole;      // the plan of every stage (ExecOptions.whole), or plan
    int stage, stages;      // this rank's stage of whole, and how many it has
    int sync_sends;         // every send synchronous
    int mpi;                // the run has more than one rank: collectives and sends go to MPI
    RtColl *colls;          // mpi: one per op, used by the collectives and point-to-point ops
    RtCommQueue *queue;     // mpi: those in flight
    int mirror;             // a device's host mirror (ExecOptions.mirror): holds, runs only host-space ops
    int64_t held[PLAN_PLACE_COUNT];   // bytes of each space held from its start (all, unless a mirror)
    uint8_t **side;         // a mirror: per tensor, its bytes when the step's outputs hold them apart
    void *side_block;
    int64_t side_bytes;
    float *work;            // the kernels' workspace (plan_alloc), or NULL
    size_t work_floats;
    int guarding;           // ExecOptions.guard
    Guard *guard[PLAN_PLACE_COUNT];  // debug: every op checked to stay inside its buffers (guard.c), per space
    char guard_err[512];    // the guard's last finding
    int64_t copied[2];      // bytes the copies between the spaces moved so far: to the host, to the device
    RtBatches *batches;     // runs of ops run as one parallel region each (batch.c), or NULL
    RtSpan *spans;          // rt_exec_time: each op's time in the runs to come, or NULL
    double *done_at;        // spans: per op, when its collective completed (rt_now, seconds)
};

static int ktype(PlanDType t)
{
    switch (t) {
    case PLAN_DT_F32: return KT_F32;
    case PLAN_DT_F16: return KT_F16;
    case PLAN_DT_BF16: return KT_BF16;
    case PLAN_DT_I32: return KT_I32;
    case PLAN_DT_COUNT: break;
    }
    return KT_F32;
}

void *rt_exec_data(const Exec *e, int32_t id)
{
    const PlanTensor *t = &e->plan->tensors[id];
    if (e->side && e->side[id]) return e->side[id];
    int64_t at = t->offset + (int64_t)e->shard_rank * t->rank_stride;
    return at + plan_tensor_nbytes(t) <= e->held[t->place] ? e->space[t->place] + at : NULL;
}

static void ktensor(const Exec *e, int32_t id, KTensor *k)
{
    const PlanTensor *t = &e->plan->tensors[id];
    k->data = rt_exec_data(e, id);
    k->dtype = ktype(t->dtype);
    k->rank = t->rank;
    for (int d = 0; d < t->rank; d++) k->shape[d] = t->shape[d];
    k->numel = plan_tensor_numel(t);
}

/* Whether y's bytes lie within x's (a view's output where memplan put it: a reshape on
 * x's first byte, a slice_view at its slice's place). */
static int lies_in(const PlanTensor *y, const PlanTensor *x)
{
    return y->place == x->place && y->rank_stride == x->rank_stride && y->offset >= x->offset &&
           y->offset + plan_tensor_nbytes(y) <= x->offset + plan_tensor_nbytes(x);
}

/* Attributes by position in the op's signature; defaults for absent ones. */
static int bind_attrs(const Plan *p, int32_t k, const OpInfo *info, KCall *c, char *err, size_t errlen)
{
    const PlanOp *op = &p->ops[k];
    const char *name = plan_str(p, op->op);
    if (info->n_params > K_MAX_ATTRS)
        return plan_fail(err, errlen, "op '%s' has %d signature parameters; the CPU kernel ABI takes %d", name,
                    info->n_params, K_MAX_ATTRS);
    for (int32_t a = 0; a < op->n_attr; a++) {
        const char *key = plan_str(p, p->attrs[op->attr + a].key);
        int known = 0;
        for (int i = 0; i < info->n_params && !known; i++)
            known = info->params[i].kind != ARG_TENSOR && info->params[i].kind != ARG_TENSORS &&
                    !strcmp(info->params[i].name, key);
        if (!known)
            return plan_fail(err, errlen, "op %d (%s): attribute '%s' is not in this fsexec's signature \"%s\"; rebuild "
                        "fsexec or recompile the plan", k, name, key, info->sig);
    }
    int have_ints = 0;
    for (int i = 0; i < info->n_params; i++) {
        const OpParam *pr = &info->params[i];
        if (pr->kind == ARG_TENSOR || pr->kind == ARG_TENSORS) continue;
        const PlanAttr *at = NULL;
        for (int32_t a = 0; a < op->n_attr; a++)
            if (!strcmp(plan_str(p, p->attrs[op->attr + a].key), pr->name)) at = &p->attrs[op->attr + a];
        if (pr->kind == ARG_INTS) {
            if (at && at->kind != PLAN_ATTR_INTS)
                return plan_fail(err, errlen, "op %d (%s): attribute '%s' should be a list", k, name, pr->name);
            if (have_ints++)
                return plan_fail(err, errlen, "op '%s' has two list attributes; the CPU kernel ABI takes one", name);
            c->ints = at ? &p->ints[at->list] : NULL;
            c->n_ints = at ? at->n_list : 0;
            if (!at && !pr->has_default)
                return plan_fail(err, errlen, "op %d (%s): attribute '%s' is missing", k, name, pr->name);
            continue;
        }
        if (!at) {
            if (!pr->has_default)
                return plan_fail(err, errlen, "op %d (%s): attribute '%s' is missing", k, name, pr->name);
            c->attr[i] = pr->def;
        } else if (at->kind == PLAN_ATTR_INTS) {
            return plan_fail(err, errlen, "op %d (%s): attribute '%s' should be a number, not a list", k, name, pr->name);
        } else {
            c->attr[i] = at->kind == PLAN_ATTR_INT ? (double)at->i : at->f;
        }
    }
    return 0;
}

/* The value of the call's attribute `name` (at its signature position), or def. */
static double call_attr(const OpInfo *info, const KCall *c, const char *name, double def)
{
    for (int i = 0; i < info->n_params; i++)
        if (!strcmp(info->params[i].name, name)) return c->attr[i];
    return def;
}

/* A collective op ("x, world:int, avg:flag=0, group:int=0, avg_over:int=0"): its world
 * must be its group's in this run, the data-parallel ranks of this stage (group 0), the
 * stages (group 1), the shard group's S or the D / S replicas (groups 2 and 3); a group
 * of more than one rank runs it on MPI, over that group. */
static int bind_collective(Exec *e, int32_t k, const OpInfo *info, ExecOp *x, char *err, size_t errlen)
{
    const Plan *p = e->plan;
    const char *name = plan_str(p, p->ops[k].op);
    int kind = rt_coll_kind(name);
    if (kind < 0 || kind >= RT_COLL_SEND || x->call.n_in != 1 || x->call.n_out != 1)
        return plan_fail(err, errlen, "op %d (%s): a collective this fsexec cannot run", k, name);
    double world = call_attr(info, &x->call, "world", 0), group = call_attr(info, &x->call, "group", OP_GROUP_DATA);
    if (group != OP_GROUP_DATA && group != OP_GROUP_PIPE && group != OP_GROUP_SHARD && group != OP_GROUP_REPLICA)
        return plan_fail(err, errlen, "op %d (%s): group %g; a collective runs over group 0 (the data-parallel ranks), "
                         "1 (the pipeline's stages), 2 (the shard group) or 3 (the replica group)", k, name, group);
    int pipe = group == OP_GROUP_PIPE, size = pipe ? e->stages : e->world, rank = pipe ? e->stage : e->rank;
    if (group == OP_GROUP_SHARD) size = e->shard, rank = e->shard_rank;
    if (group == OP_GROUP_REPLICA) size = e->world / e->shard, rank = e->rank / e->shard;
    if (world != size && group >= OP_GROUP_SHARD)
        return plan_fail(err, errlen, "op %d (%s) over the %s group (group %g) is for %g ranks, but this run's has %d "
                         "(shard_group %d of %d data-parallel ranks)", k, name, group == OP_GROUP_SHARD ? "shard" :
                         "replica", group, world, size, e->shard, e->world);
    if (world != size && pipe)
        return plan_fail(err, errlen, "op %d (%s) over the pipeline group (group 1) is for %g stages, but this run has "
                         "%d", k, name, world, size);
    if (world != size)
        return plan_fail(err, errlen, "op %d (%s) is for a world of %g ranks, but this run has %d%s", k, name, world,
                         size, e->stages > 1 ? " in this stage" : "");
    if (size == 1) return 0;
    const KTensor *in = &x->call.in[0], *out = &x->call.out[0];
    int avg = kind != RT_COLL_ALL_GATHER && call_attr(info, &x->call, "avg", 0) != 0;
    double over = call_attr(info, &x->call, "avg_over", 0);
    x->coll = &e->colls[k];
    char why[256];
    if (rt_coll_prepare(x->coll, (RtCollKind)kind, p->tensors[p->ids[p->ops[k].in]].dtype, in->data, in->numel,
                        out->data, out->numel, size, rank, avg, why, sizeof why))
        return plan_fail(err, errlen, "op %d: %s", k, why);
    x->coll->group = (int)group;
    if (avg && over > 0) x->coll->avg_over = (int)over;
    return 0;
}

/* A point-to-point op, send ("x, peer:int, tag:int") or recv ("shape:ints, dtype:int,
 * peer:int, tag:int"): to or from stage `peer`'s rank at this rank's data-parallel index,
 * on MPI, with its tag (MPI promises tags up to 32767). */
static int bind_p2p(Exec *e, int32_t k, const OpInfo *info, ExecOp *x, char *err, size_t errlen)
{
    const Plan *p = e->plan;
    const char *name = plan_str(p, p->ops[k].op);
    int kind = rt_coll_kind(name), send = kind == RT_COLL_SEND;
    double peer = call_attr(info, &x->call, "peer", -1), tag = call_attr(info, &x->call, "tag", 0);
    if ((!send && kind != RT_COLL_RECV) || x->call.n_in != send || x->call.n_out != !send)
        return plan_fail(err, errlen, "op %d (%s): a point-to-point op this fsexec cannot run", k, name);
    if (peer != (int)peer || peer < 0 || peer >= e->stages || peer == e->stage)
        return plan_fail(err, errlen, "op %d (%s): peer stage %g is not another stage of this %d-stage plan (this is "
                         "stage %d)", k, name, peer, e->stages, e->stage);
    if (tag != (int)tag || tag < 0 || tag > 32767)
        return plan_fail(err, errlen, "op %d (%s): tag %g is not an MPI tag (0 to 32767)", k, name, tag);
    const PlanTensor *t = &p->tensors[send ? p->ids[p->ops[k].in] : p->ids[p->ops[k].out]];
    if (!send && call_attr(info, &x->call, "dtype", -1) != t->dtype)
        return plan_fail(err, errlen, "op %d (recv): dtype %g, but its output is %s", k,
                         call_attr(info, &x->call, "dtype", -1), plan_dtype_name(t->dtype));
    if (e->guarding)
        return plan_fail(err, errlen, "op %d (%s): --debug-guard waits for every op as it ends, which a pipeline's "
                         "sends and receives cannot do; run it on a one-stage plan", k, name);
    const KTensor *buf = send ? &x->call.in[0] : &x->call.out[0];
    x->coll = &e->colls[k];
    char why[256];
    if (rt_p2p_prepare(x->coll, (RtCollKind)kind, t->dtype, buf->data, buf->numel, (int)peer * e->world + e->rank,
                       e->sync_sends, why, sizeof why))
        return plan_fail(err, errlen, "op %d: %s", k, why);
    x->coll->tag = (int)tag;
    return 0;
}

static int build_op(Exec *e, int32_t k, char *err, size_t errlen)
{
    const Plan *p = e->plan;
    const PlanOp *op = &p->ops[k];
    const char *name = plan_str(p, op->op);
    OpKind kind = op_lookup(name);
    CpuKernel fn = kind == OP_COUNT ? NULL : cpu_kernel_by_name(name);
    if (!fn) return plan_fail(err, errlen, "plan uses op '%s' that this fsexec does not know; rebuild fsexec", name);
    const OpInfo *info = op_info(kind);
    if ((info->n_tensors >= 0 && op->n_in != info->n_tensors) || (info->n_tensors < 0 && op->n_in < 1) ||
        (info->n_out >= 0 && op->n_out != info->n_out))
        return plan_fail(err, errlen, "op %d (%s): %d inputs and %d outputs do not fit this fsexec's \"%s\"; rebuild "
                    "fsexec or recompile the plan", k, name, op->n_in, op->n_out, info->sig);
    if (op->n_in > K_MAX_TENSORS || op->n_out > K_MAX_TENSORS)
        return plan_fail(err, errlen, "op %d (%s): %d inputs, %d outputs; the CPU kernel ABI takes at most %d", k, name,
                    op->n_in, op->n_out, K_MAX_TENSORS);
    ExecOp *x = &e->ops[k];
    x->fn = fn;
    x->phase_bit = 1u << op->phase;
    x->wait = op->wait, x->n_wait = op->n_wait;
    x->call.n_in = op->n_in;
    x->call.n_out = op->n_out;
    for (int32_t i = 0; i < op->n_in; i++) ktensor(e, p->ids[op->in + i], &x->call.in[i]);
    for (int32_t i = 0; i < op->n_out; i++) ktensor(e, p->ids[op->out + i], &x->call.out[i]);
    if ((info->flags & OPF_VIEW) && op->n_in >= 1 && op->n_out == 1)
        x->skip = lies_in(&p->tensors[p->ids[op->out]], &p->tensors[p->ids[op->in]]);
    if (bind_attrs(p, k, info, &x->call, err, errlen)) return -1;
    int rc = info->flags & OPF_COLLECTIVE ? bind_collective(e, k, info, x, err, errlen)
             : info->flags & OPF_P2P      ? bind_p2p(e, k, info, x, err, errlen)
                                          : 0;
    if (rc) return -1;
    if (x->coll) x->coll->plan = p, x->coll->op = k;  // for the watchdog: which op of the plan hangs
    x->block = x->coll && op->stream == PLAN_STREAM_COMPUTE;
    if (info->comm == COMM_TO_HOST || info->comm == COMM_TO_DEVICE) {
        x->copy = 1 + (info->comm == COMM_TO_DEVICE);
        x->copy_bytes = plan_tensor_nbytes(&p->tensors[p->ids[op->in]]);
    }
    return 0;
}

/* The workspace: the most any call needs at least, else what the largest can use up to
 * WORK_CAP; given to every call. */
static int build_workspace(Exec *e, char *err, size_t errlen)
{
    size_t n = 0;
    for (int32_t k = 0; k < e->n_ops; k++) {
        const ExecOp *x = &e->ops[k];
        if (x->skip || x->coll) continue;
        CpuWork w = cpu_work(x->fn, &x->call);
        size_t want = w.all < WORK_CAP ? w.all : WORK_CAP;
        want = w.least > want ? w.least : want;
        n = want > n ? want : n;
    }
    if (!n) return 0;
    if (n > SIZE_MAX / sizeof(float) || !(e->work = plan_alloc(n * sizeof(float))))
        return plan_fail(err, errlen, "cannot allocate the %.1f MiB kernel workspace (out of memory)",
                       (double)n * sizeof(float) / (1 << 20));
    e->work_floats = n;
    for (int32_t k = 0; k < e->n_ops; k++) e->ops[k].call.work = e->work, e->ops[k].call.work_floats = n;
    return 0;
}

/* Buffers to poison after each op: roots that are neither persistent nor outputs. */
static int build_dead_lists(Exec *e, char *err, size_t errlen)
{
    const Plan *p = e->plan;
    int32_t n = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (t->alias == PLAN_NONE && !plan_tensor_is_persistent(t) && t->live_end < p->n_ops)
            e->ops[t->live_end].n_dead++, n++;
    }
    e->dead = plan_alloc(sizeof *e->dead * (size_t)n);
    if (!e->dead) return plan_fail(err, errlen, "out of memory");
    int32_t at = 0;
    for (int32_t k = 0; k < p->n_ops; k++) e->ops[k].dead = at, at += e->ops[k].n_dead, e->ops[k].n_dead = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (t->alias == PLAN_NONE && !plan_tensor_is_persistent(t) && t->live_end < p->n_ops) {
            ExecOp *x = &e->ops[t->live_end];
            e->dead[x->dead + x->n_dead++] = i;
        }
    }
    return 0;
}

/* Every tensor no op writes starts from its init kind; float params and state need f32. */
static int init_tensors(Exec *e, uint64_t seed, char *err, size_t errlen)
{
    const Plan *p = e->plan;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (t->producer != PLAN_NONE || t->alias != PLAN_NONE) continue;
        uint8_t *data = rt_exec_data(e, i);
        int64_t n = plan_tensor_numel(t);
        if (t->role == PLAN_ROLE_PARAM && rt_flat_is_storage(p, i)) {
            if (rt_flat_init(p, i, e->shard_rank, seed, (float *)data, err, errlen)) return -1;
            continue;
        }
        if (t->init == PLAN_INIT_NONE || t->init == PLAN_INIT_ZEROS) {
            memset(data, 0, (size_t)plan_tensor_nbytes(t));
            continue;
        }
        if (t->dtype != PLAN_DT_F32)
            return plan_fail(err, errlen, "tensor '%s' is %s with init %s; this fsexec initializes f32 tensors only",
                        plan_tensor_label(p, i), plan_dtype_name(t->dtype), plan_init_name(t->init));
        /* A tied param starts as the param it is tied to: same name, same values. */
        int32_t from = t->tied_to != PLAN_NONE ? t->tied_to : i;
        int64_t own = plan_tensor_logical_numel(t);  // a padded param's padding rows start at zero
        rt_init_param(plan_str(p, p->tensors[from].name), seed, t->init, t->init_a, t->init_b, 0, own, (float *)data);
        memset((float *)data + own, 0, sizeof(float) * (size_t)(n - own));
    }
    rt_exec_cast_params(e);
    if (e->rng) {  // the step word is written before each step (rt_exec_set_step)
        e->rng[0] = (int32_t)(uint32_t)seed, e->rng[1] = (int32_t)(uint32_t)(seed >> 32);
        e->rng[2] = 0, e->rng[3] = e->rank;
    }
    return 0;
}

static int find_step(Exec *e, char *err, size_t errlen)
{
    const Plan *p = e->plan;
    int32_t i = plan_role_tensor(p, PLAN_SR_STEP);
    if (i == PLAN_NONE) return 0;
    const PlanTensor *t = &p->tensors[i];
    if (t->dtype != PLAN_DT_I32 || t->rank != 0)
        return plan_fail(err, errlen, "the step input '%s' is %s of rank %d; expected an i32 scalar",
                         plan_tensor_label(p, i), plan_dtype_name(t->dtype), t->rank);
    e->step = rt_exec_data(e, i);
    return 0;
}

/* Dropout's RNG words (plan.h: PLAN_SR_RNG), when some op reads them. */
static int find_rng(Exec *e, char *err, size_t errlen)
{
    const Plan *p = e->plan;
    int32_t i = plan_role_tensor(p, PLAN_SR_RNG);
    if (i == PLAN_NONE) return 0;
    const PlanTensor *t = &p->tensors[i];
    if (t->dtype != PLAN_DT_I32 || t->rank != 1 || t->shape[0] != 4 || t->role != PLAN_ROLE_INPUT)
        return plan_fail(err, errlen, "the rng input '%s' is not an i32 [4] input", plan_tensor_label(p, i));
    e->rng = rt_exec_data(e, i);
    return 0;
}

void rt_exec_set_step(Exec *e, int64_t step)
{
    if (e->step) *e->step = (int32_t)step;
    if (e->rng) e->rng[2] = (int32_t)step;
}

/* Whether the host must hold tensor i for a device: what init writes (persistent state,
 * and anything no op makes), what the data loader, the weights files and the progress
 * line read or write. */
static int mirrored(const Plan *p, int32_t i)
{
    const PlanTensor *t = &p->tensors[i];
    return t->alias == PLAN_NONE && (plan_tensor_is_persistent(t) || t->producer == PLAN_NONE);
}

/* A mirror's prefix of each space: memplan puts persistent state at the bottom, so the
 * mirror holds bytes [0, held) of each space, and the step's outputs and the tensors
 * with a step role (the fp16 seed --debug-overflow-at poisons) that lie above it in
 * buffers of their own (side). */
static int64_t mirror_prefix(const Exec *e, int s)
{
    const Plan *p = e->plan;
    int64_t held = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        int64_t end = t->offset + (int64_t)e->shard_rank * t->rank_stride + plan_tensor_nbytes(t);
        if ((int)t->place == s && mirrored(p, i) && end > held) held = end;
    }
    return held;
}

static int alloc_side(Exec *e, char *err, size_t errlen)
{
    const Plan *p = e->plan;
    int32_t *at = plan_alloc(sizeof *at * ((size_t)p->n_tensors + 1));  // a root's place in the side block, or -1
    e->side = plan_alloc(sizeof *e->side * ((size_t)p->n_tensors + 1));
    if (!at || !e->side) return plan_dealloc(at), plan_fail(err, errlen, "out of memory");
    int64_t n = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) at[i] = -1, e->side[i] = NULL;
    for (int32_t k = 0; k < p->n_outputs + p->n_tensors; k++) {  // the outputs, and what has a step role
        int32_t o = k < p->n_outputs ? p->outputs[k] : k - p->n_outputs;
        if (k >= p->n_outputs && p->tensors[o].step_role == PLAN_SR_NONE) continue;
        int32_t r = p->tensors[o].alias != PLAN_NONE ? p->tensors[o].alias : o;
        const PlanTensor *t = &p->tensors[r];
        if (at[r] >= 0 || t->offset + (int64_t)e->shard_rank * t->rank_stride + plan_tensor_nbytes(t) <= e->held[t->place])
            continue;
        at[r] = (int32_t)(n / ARENA_ALIGN);
        n += (plan_tensor_nbytes(t) + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    }
    if (n && !(e->side_block = plan_alloc((size_t)n + ARENA_ALIGN))) {
        plan_dealloc(at);
        return plan_fail(err, errlen, "out of memory");
    }
    uint8_t *base = (uint8_t *)(((uintptr_t)e->side_block + ARENA_ALIGN - 1) & ~(uintptr_t)(ARENA_ALIGN - 1));
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        int32_t r = t->alias != PLAN_NONE ? t->alias : i;
        if (at[r] < 0) continue;
        int64_t off = (t->offset + (int64_t)e->shard_rank * t->rank_stride) -
                      (p->tensors[r].offset + (int64_t)e->shard_rank * p->tensors[r].rank_stride);
        e->side[i] = base + (int64_t)at[r] * ARENA_ALIGN + off;
    }
    e->side_bytes = n;
    plan_dealloc(at);
    return 0;
}

/* One allocation per memory space, each exactly its planned size (aligned); a mirror's
 * only its prefix (and the outputs apart). */
static int alloc_spaces(Exec *e, const PlanProgram *prog, char *err, size_t errlen)
{
    for (int s = 0; s < PLAN_PLACE_COUNT; s++) {
        /* A mirror holds the host space whole: offload's host ops run on it there. */
        int64_t n = e->mirror && s != PLAN_PLACE_HOST ? mirror_prefix(e, s) : prog->space_bytes[s];
        e->held[s] = n;
        if ((uint64_t)n > SIZE_MAX - 2 * ARENA_ALIGN)
            return plan_fail(err, errlen, "the plan's %s arena (%lld bytes) is not a size this machine can allocate",
                             plan_place_name((PlanPlace)s), (long long)n);
        if (!(e->block[s] = plan_alloc((size_t)n + ARENA_ALIGN - 1)))
            return plan_fail(err, errlen, "cannot allocate the %.1f MiB %s arena the plan needs (out of memory)",
                             (double)n / (1 << 20), plan_place_name((PlanPlace)s));
        e->space[s] = (uint8_t *)(((uintptr_t)e->block[s] + ARENA_ALIGN - 1) & ~(uintptr_t)(ARENA_ALIGN - 1));
        e->space_bytes[s] = prog->space_bytes[s];
    }
    return e->mirror ? alloc_side(e, err, errlen) : 0;
}

/* A mirror's ops: those of the host space only, which the device's backend has run here
 * (rt_exec_run_host_op); with none, nothing. */
static int build_host_ops(Exec *e, char *err, size_t errlen)
{
    const Plan *p = e->plan;
    int32_t n = 0;
    for (int32_t k = 0; k < p->n_ops; k++) n += plan_op_on_host(p, k);
    if (!n) return 0;
    if (!(e->ops = plan_alloc(sizeof *e->ops * (size_t)p->n_ops))) return plan_fail(err, errlen, "out of memory");
    memset(e->ops, 0, sizeof *e->ops * (size_t)p->n_ops);
    e->n_ops = p->n_ops;
    for (int32_t k = 0; k < p->n_ops; k++)
        if (plan_op_on_host(p, k) && build_op(e, k, err, errlen)) return -1;
    return build_workspace(e, err, errlen);
}

int rt_exec_run_host_op(Exec *e, int32_t k)
{
    if (!e->ops || k < 0 || k >= e->n_ops || !plan_op_on_host(e->plan, k) || !e->ops[k].fn) {
        snprintf(e->guard_err, sizeof e->guard_err, "op %d does not compute in the host space", k);
        return -1;
    }
    if (!e->ops[k].skip) e->ops[k].fn(&e->ops[k].call);
    return 0;
}

/* The runs of ops batch.c runs as one parallel region each; none under the debug modes,
 * which look at every op as it ends, or when asked to run op by op. */
static int build_batches(Exec *e, const ExecOptions *o, char *err, size_t errlen)
{
    size_t n = (size_t)e->n_ops + 1;
    if (e->nan_fill || e->guarding || o->one_by_one) return 0;
    const KCall **call = plan_alloc(sizeof *call * n);
    CpuKernel *fn = plan_alloc(sizeof *fn * n);
    unsigned char *may = plan_alloc(n);
    if (call && fn && may) {
        for (int32_t k = 0; k < e->n_ops; k++) {
            const ExecOp *x = &e->ops[k];
            call[k] = &x->call, fn[k] = x->fn, may[k] = x->fn && !x->skip && !x->coll && !x->copy;
        }
        e->batches = rt_batches_new(e->plan, call, fn, may);
    }
    plan_dealloc(call), plan_dealloc(fn), plan_dealloc(may);
    return call && fn && may ? 0 : plan_fail(err, errlen, "out of memory");
}

static int setup(Exec *e, const ExecOptions *o, char *err, size_t errlen)
{
    const Plan *p = e->plan;
    if (p->n_programs < 1)
        return plan_fail(err, errlen,
                         "the plan has no program (no memory plan); recompile it with this version of fsc");
    if (p->n_programs > 1)
        return plan_fail(err, errlen, "the plan has %d pipeline stages; an Exec runs one stage's program "
                         "(plan_extract_program)", p->n_programs);
    const PlanProgram *prog = &p->programs[0];
    if (e->stage < 0 || e->stage >= e->stages || (e->stages > 1 && prog->stage != e->stage))
        return plan_fail(err, errlen, "the plan is stage %d's program, but runs as stage %d of %d", prog->stage,
                         e->stage, e->stages);
    if (prog->dp_world != e->world)
        return plan_fail(err, errlen, "plan compiled for world %d, but %d rank%s started", prog->dp_world, e->world,
                         e->world == 1 ? "" : "s");
    if (e->rank < 0 || e->rank >= e->world)
        return plan_fail(err, errlen, "rank %d is outside the world of %d", e->rank, e->world);
    if (alloc_spaces(e, prog, err, errlen)) return -1;
    /* A mirror runs only the host space's ops (offload's update, rt_exec_run_host_op): its
     * device's backend proves the schedule (cs_build) and runs the rest. */
    if (e->mirror) return find_step(e, err, errlen) || find_rng(e, err, errlen) || build_host_ops(e, err, errlen) || init_tensors(e, o->seed, err, errlen);
    if (plan_check_schedule(p, e->shard_rank, err, errlen)) return -1;
    e->ops = plan_alloc(sizeof *e->ops * (size_t)p->n_ops);
    if (!e->ops) return plan_fail(err, errlen, "out of memory");
    memset(e->ops, 0, sizeof *e->ops * (size_t)p->n_ops);
    e->n_ops = p->n_ops;
    if (e->mpi) {
        e->colls = plan_alloc(sizeof *e->colls * (size_t)(p->n_ops + 1));
        e->queue = rt_comm_queue_new(p->n_ops);
        if (!e->colls || !e->queue) return plan_fail(err, errlen, "out of memory");
    }
    for (int32_t k = 0; k < p->n_ops; k++)
        if (build_op(e, k, err, errlen)) return -1;
    /* Persistent collectives may synchronize their group as they are set up: the stage's
     * ones first, then the pipeline's (the same order on every stage), so that no two
     * ranks wait for each other in different groups. */
    for (int g = OP_GROUP_DATA; g < OP_GROUP_COUNT; g++)
        for (int32_t k = 0; k < p->n_ops; k++)
            if (e->ops[k].coll && e->ops[k].coll->group == g) rt_comm_bind(e->queue, e->ops[k].coll);
    if (build_workspace(e, err, errlen) || build_batches(e, o, err, errlen)) return -1;
    if ((e->nan_fill && build_dead_lists(e, err, errlen)) || find_step(e, err, errlen) || find_rng(e, err, errlen))
        return -1;
    for (int s = 0; s < PLAN_PLACE_COUNT && e->nan_fill; s++) memset(e->space[s], 0xff, (size_t)e->space_bytes[s]);
    for (int s = 0; s < PLAN_PLACE_COUNT && o->guard; s++)
        if (!(e->guard[s] = rt_guard_new(p, (PlanPlace)s, e->space[s], e->space_bytes[s], err, errlen))) return -1;
    return init_tensors(e, o->seed, err, errlen);
}

Exec *rt_exec_new(const Plan *p, const ExecOptions *o, char *err, size_t errlen)
{
    if (rt_plan_check_stage(p, o->whole, err, errlen)) return NULL;  // no op reaches a kernel it does not fit
    Exec *e = plan_alloc(sizeof *e);
    if (!e) {
        plan_fail(err, errlen, "out of memory");
        return NULL;
    }
    memset(e, 0, sizeof *e);
    e->plan = p;
    e->nan_fill = o->nan_fill && !o->mirror;
    e->mirror = o->mirror;
    e->rank = o->rank;
    e->world = o->world > 0 ? o->world : 1;
    e->shard = (int)plan_shard_group(p, e->world);
    e->shard_rank = e->rank >= 0 ? e->rank % e->shard : e->rank;
    e->whole = o->whole ? o->whole : p;
    e->stage = o->whole ? o->stage : 0;
    e->stages = o->whole && o->whole->n_programs > 1 ? o->whole->n_programs : 1;
    e->sync_sends = o->sync_sends;
    e->mpi = e->world * e->stages > 1;
    e->guarding = o->guard;
    if (setup(e, o, err, errlen)) {
        rt_exec_free(e);
        return NULL;
    }
    return e;
}

void rt_exec_free(Exec *e)
{
    if (!e) return;
    for (int s = 0; s < PLAN_PLACE_COUNT; s++) plan_dealloc(e->block[s]);
    plan_dealloc(e->side);
    plan_dealloc(e->side_block);
    plan_dealloc(e->work);
    plan_dealloc(e->ops);
    plan_dealloc(e->dead);
    plan_dealloc(e->colls);
    plan_dealloc(e->done_at);
    rt_batches_free(e->batches);
    rt_comm_queue_free(e->queue);
    for (int s = 0; s < PLAN_PLACE_COUNT; s++) rt_guard_free(e->guard[s]);
    plan_dealloc(e);
}

int rt_exec_run_ops(Exec *e, int64_t step, int32_t from, int32_t to, unsigned phases)
{
    if (e->mirror) {
        snprintf(e->guard_err, sizeof e->guard_err, "a host mirror runs no ops (its device does)");
        return -1;
    }
    if (step < 1 || step > INT32_MAX || from < 0 || to > e->n_ops) return -1;
    rt_exec_set_step(e, step);
    const PlanTensor *t = e->plan->tensors;
    const int32_t *waits = e->plan->waits;
    RtCommQueue *q = e->queue;
    RtSpan *spans = e->spans;
    double t0 = spans ? rt_now() : 0, at = 0;
    for (int32_t k = from; k < to; k++) {
        const ExecOp *x = &e->ops[k];
        if (!(x->phase_bit & phases)) continue;
        for (int32_t w = 0; w < x->n_wait && rt_comm_pending(q); w++) {
            const RtColl *c = e->ops[waits[x->wait + w]].coll;
            if (c) rt_comm_wait_for(q, c);
        }
        for (int s = 0; s < PLAN_PLACE_COUNT && e->guarding && !x->skip; s++) rt_guard_before(e->guard[s], k);
        if (spans) at = rt_now();
        int32_t run = e->batches ? rt_batch_len(e->batches, k) : 0;
        if (run && k + run <= to) {  // its members get no span of their own: the first holds the run's
            rt_batch_run(e->batches, k);
            for (int32_t j = k + 1; j < k + run && spans; j++) spans[j] = (RtSpan){.start = (rt_now() - t0) * 1e6};
            if (spans) spans[k] = (RtSpan){.start = (at - t0) * 1e6, .dur = (rt_now() - at) * 1e6};
            k += run - 1;
            if (rt_comm_pending(q)) rt_comm_poll(q);
            continue;
        }
        if (x->coll) {
            if (spans) x->coll->done_at = &e->done_at[k];
            rt_comm_start(q, x->coll);
            if (x->block) rt_comm_wait_for(q, x->coll);
        } else if (!x->skip) {
            x->fn(&x->call);
            if (x->copy) e->copied[x->copy - 1] += x->copy_bytes;
        }
        if (spans) spans[k] = (RtSpan){.start = (at - t0) * 1e6, .dur = x->skip ? 0 : (rt_now() - at) * 1e6};
        if (e->guarding && !x->skip) {
            if (rt_comm_pending(q)) rt_comm_wait_all(q);
            for (int s = 0; s < PLAN_PLACE_COUNT; s++)
                if (rt_guard_after(e->guard[s], k, e->guard_err, sizeof e->guard_err)) return -1;
        }
        for (int32_t d = 0; d < x->n_dead; d++) {  // a collective's buffers live until it is waited for
            int32_t id = e->dead[x->dead + d];
            memset(rt_exec_data(e, id), 0xff, (size_t)plan_tensor_nbytes(&t[id]));
        }
        if (rt_comm_pending(q)) rt_comm_poll(q);
    }
    if (rt_comm_pending(q)) rt_comm_wait_all(q);
    for (int32_t k = from; k < to && spans; k++)  // a collective ran from its start to when it was seen done
        if (e->ops[k].coll && (e->ops[k].phase_bit & phases)) {
            spans[k].dur = (e->done_at[k] - t0) * 1e6 - spans[k].start;
            e->ops[k].coll->done_at = NULL;
        }
    return 0;
}

int rt_exec_time(Exec *e, RtSpan *spans)
{
    if (spans && !e->done_at && !(e->done_at = plan_alloc(sizeof *e->done_at * ((size_t)e->n_ops + 1)))) return -1;
    e->spans = spans;
    return 0;
}

int rt_exec_run(Exec *e, int64_t step, unsigned phases) { return rt_exec_run_ops(e, step, 0, e->n_ops, phases); }

int32_t rt_exec_first_op(const Exec *e, PlanPhase phase)
{
    for (int32_t k = 0; k < e->plan->n_ops; k++)
        if (e->plan->ops[k].phase == phase) return k;
    return e->plan->n_ops;
}

void rt_exec_tensor_id(const Exec *e, int32_t id, RtTensor *out)
{
    const PlanTensor *t = &e->plan->tensors[id];
    *out = (RtTensor){.id = id, .name = plan_str(e->plan, t->name), .data = rt_exec_data(e, id),
                      .dtype = t->dtype, .role = t->role, .rank = t->rank, .shape = t->shape,
                      .numel = plan_tensor_numel(t)};
}

int rt_exec_tensor(const Exec *e, const char *name, RtTensor *out)
{
    const Plan *p = e->plan;
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (!strcmp(plan_str(p, p->tensors[i].name), name)) {
            rt_exec_tensor_id(e, i, out);
            return 0;
        }
    return -1;
}

const Plan *rt_exec_plan(const Exec *e) { return e->plan; }
const char *rt_exec_error(const Exec *e) { return e->guard_err; }
int rt_exec_rank(const Exec *e) { return e->rank; }
int rt_exec_world(const Exec *e) { return e->world; }
const Plan *rt_exec_whole(const Exec *e) { return e->whole; }
int rt_exec_stage(const Exec *e) { return e->stage; }
int rt_exec_stages(const Exec *e) { return e->stages; }
int64_t rt_exec_arena_bytes(const Exec *e) { return e->space_bytes[PLAN_PLACE_DEVICE]; }
int64_t rt_exec_space_bytes(const Exec *e, PlanPlace s) { return e->space_bytes[s]; }
int64_t rt_exec_held_bytes(const Exec *e, PlanPlace s) { return e->held[s]; }
int64_t rt_exec_host_bytes(const Exec *e)
{
    return e->held[PLAN_PLACE_DEVICE] + e->held[PLAN_PLACE_HOST] + e->side_bytes;
}
void rt_exec_copied(const Exec *e, int64_t *to_host, int64_t *to_device)
{
    *to_host = e->copied[0], *to_device = e->copied[1];
}
int64_t rt_exec_work_bytes(const Exec *e) { return (int64_t)(e->work_floats * sizeof(float)); }
const void *rt_exec_arena(const Exec *e) { return e->space[PLAN_PLACE_DEVICE]; }
const void *rt_exec_space(const Exec *e, PlanPlace s) { return e->space[s]; }

void rt_set_threads(int n)
{
#ifdef _OPENMP
    if (n >= 1) omp_set_num_threads(n);
    openblas_set_num_threads(1);  // one pool: the matmul kernel splits large GEMMs over OpenMP's threads
#else
    if (n >= 1) openblas_set_num_threads(n);
#endif
}

int rt_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
