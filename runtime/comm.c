/* runtime/comm.c: MPI between CPU ranks: start and end, the communicators of a plan's
 * stages, the step's collectives and point-to-point ops, the few blocking calls outside
 * the step (gathering weights, agreeing on an error), and a watchdog that ends every
 * rank when a step hangs.
 *
 * A pipeline's world is stages x dp (rt_comm_layout): MPI_COMM_WORLD is split into the
 * data-parallel ranks of each stage (a collective's group 0; the weights' gather and the
 * accuracy's sum) and the ranks of each data-parallel index, one per stage (group 1), and
 * duplicated for the sends and receives between stages, so their tag-0 messages meet
 * nothing else: the k-th send from a to b meets the k-th receive on b from a, which the
 * compiler ordered (plan_check_p2p proves it). Hybrid sharding's shard groups (2) and
 * replica groups (3) are split from the world too (rt_comm_layout), with or without stages. Sends and receives are persistent
 * requests (MPI_Send_init, MPI_Ssend_init with --sync-sends, MPI_Recv_init), started and
 * waited for in the step like the collectives, in the same queue. Agreeing on a result
 * stays world-wide. With one stage the world is group 0 and nothing is split.
 *
 * MPI is started only for a world of more than one rank; a world-1 run never touches it
 * (the executor uses the kernels of runtime/cpu/comm_local.c instead). Every MPI call
 * goes through MPI_CHECK, which prints `[rank r] runtime/comm.c:LINE: CALL failed: why`
 * and calls MPI_Abort, so a failure on one rank ends all of them (MPI_COMM_WORLD returns
 * errors to us rather than aborting on its own, so the message is ours).
 *
 * The step's collectives are nonblocking. Where MPI has persistent collectives (MPI 4's
 * MPI_Allreduce_init ..., or Open MPI 4's MPIX_ extension) each is set up once when the
 * plan is loaded and only MPI_Start'ed in the step, so not even MPI allocates a schedule
 * there; elsewhere MPI_Iallreduce, MPI_Ireduce_scatter_block, MPI_Iallgather each step.
 * The executor starts one when the schedule reaches it, tests pending ones between ops
 * so they progress, and waits for one only before an op touches (reads or writes) bytes
 * overlapping its input or output; the queue is preallocated. An average (avg=1) is a sum divided by the world once the
 * collective completes, as torch's DDP divides its gradients.
 *
 * f16 and bf16 (gradients reduced in the compute dtype) are summed by our own MPI_Ops,
 * since MPI has no 16-bit float type: each pairwise step adds in f32 and rounds to
 * nearest even once, as NCCL's half-precision sums do; an average is then divided in
 * f32 and rounded once more.
 *
 * In place: all_reduce with out == x, all_gather with x at rank r's slice of out, and
 * reduce_scatter with out inside x use MPI_IN_PLACE (MPI leaves a reduce_scatter's
 * result at the start of the buffer; when out is elsewhere in x it is moved there once
 * the collective completes). Any other overlap of input and output is refused when the
 * plan is loaded.
 *
 * The watchdog (watchdog.c) hears of every collective and point-to-point op: each is entered
 * (rt_watchdog_enter, before MPI is called) and waited for (rt_watchdog_wait around a
 * blocking MPI call), a store or two into this rank's beacon. The beacons live in one
 * MPI_Win_allocate_shared window per node (Open MPI's osc/sm: shared pages), so that a
 * rank whose step hangs reads where every rank of its node is with plain loads, even one
 * that is stopped and answers nothing. Without such a window (no osc/sm) the run goes on
 * and the watchdog knows this rank only.
 */
#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#endif
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels.h"
#include "ops.h"
#include "runtime.h"

static struct {
    int up;          // MPI_Init done, MPI_Finalize not yet
    int rank, world;
    int stages, dp;  // the plan's layout (rt_comm_layout): world = stages x dp
    MPI_Op sum_f16, sum_bf16;  // user ops, created with MPI
    MPI_Win beacons;           // the node's watchdog beacons, or MPI_WIN_NULL
    MPI_Comm group[OP_GROUP_COUNT];  // by a collective's group (OP_GROUP_DATA, _PIPE, _SHARD, _REPLICA); MPI_COMM_NULL: none made
    MPI_Comm p2p;              // point-to-point ops only: a copy of the world, or MPI_COMM_NULL
    char who[48];              // "rank 3" or "rank 3, stage 1": how messages name this rank
} comm = {0, 0, 1, 1, 1, MPI_OP_NULL, MPI_OP_NULL, MPI_WIN_NULL, {MPI_COMM_NULL, MPI_COMM_NULL, MPI_COMM_NULL, MPI_COMM_NULL},
          MPI_COMM_NULL, "rank 0"};

/* The communicator of a collective's group: the world until rt_comm_layout splits it. */
static MPI_Comm group_comm(int g) { return comm.group[g] != MPI_COMM_NULL ? comm.group[g] : MPI_COMM_WORLD; }

static const char *short_path(const char *file)
{
    const char *s = strstr(file, "runtime/");
    return s ? s : file;
}

static void comm_fatal(const char *file, int line, const char *what, int rc)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
    fprintf(stderr, "[%s] %s:%d: %s failed: %s\n", comm.who, short_path(file), line, what, msg);
    rt_comm_abort(1);
}

#if MPI_VERSION >= 4
#define PERSISTENT 1
#define ALLREDUCE_INIT MPI_Allreduce_init
#define REDUCE_SCATTER_BLOCK_INIT MPI_Reduce_scatter_block_init
#define ALLGATHER_INIT MPI_Allgather_init
#elif defined(OMPI_HAVE_MPI_EXT_PCOLLREQ)
#define PERSISTENT 1
#define ALLREDUCE_INIT MPIX_Allreduce_init
#define REDUCE_SCATTER_BLOCK_INIT MPIX_Reduce_scatter_block_init
#define ALLGATHER_INIT MPIX_Allgather_init
#else
#define PERSISTENT 0
#endif

#define MPI_CHECK(call)                                                         \
    do {                                                                        \
        int rc_ = (call);                                                       \
        if (rc_ != MPI_SUCCESS) comm_fatal(__FILE__, __LINE__, #call, rc_);      \
    } while (0)

/* ---- start and end ------------------------------------------------------------------- */

static void sum_f16(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    const uint16_t *x = in;
    uint16_t *y = inout;
    for (int i = 0; i < *len; i++) y[i] = cpu_f32_to_f16(cpu_f16_to_f32(x[i]) + cpu_f16_to_f32(y[i]));
}

static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    const uint16_t *x = in;
    uint16_t *y = inout;
    for (int i = 0; i < *len; i++) y[i] = cpu_f32_to_bf16(cpu_bf16_to_f32(x[i]) + cpu_bf16_to_f32(y[i]));
}

/* One beacon per rank in a window the node's ranks share (see the top); every beacon of
 * the world attached to the watchdog, NULL for ranks of other nodes. No window (the
 * shared-memory component missing or out of memory on any local rank): none, and on. */
static int share_beacons(MPI_Comm local, char *err, size_t errlen)
{
    int n;
    MPI_CHECK(MPI_Comm_size(local, &n));
    RtBeacon *mine = NULL;
    int bad = MPI_Win_allocate_shared((MPI_Aint)rt_beacon_bytes(), 1, MPI_INFO_NULL, local, &mine,
                                      &comm.beacons) != MPI_SUCCESS;
    if (bad) comm.beacons = MPI_WIN_NULL;
    RtBeacon **all = plan_alloc(sizeof *all * (size_t)comm.world);
    int *ranks = plan_alloc(sizeof *ranks * (size_t)n * 2);
    bad |= !all || !ranks;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_LOR, local));
    if (!bad) {
        MPI_Group lg, wg;
        MPI_CHECK(MPI_Comm_group(local, &lg));
        MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &wg));
        for (int i = 0; i < n; i++) ranks[i] = i;
        MPI_CHECK(MPI_Group_translate_ranks(lg, n, ranks, wg, ranks + n));
        MPI_CHECK(MPI_Group_free(&lg));
        MPI_CHECK(MPI_Group_free(&wg));
        for (int r = 0; r < comm.world; r++) all[r] = NULL;
        rt_beacon_clear(mine);
        for (int i = 0; i < n; i++) {
            MPI_Aint size;
            int unit;
            void *base;
            MPI_CHECK(MPI_Win_shared_query(comm.beacons, i, &size, &unit, &base));
            if ((uintptr_t)base % sizeof(int64_t) == 0 && (size_t)size >= rt_beacon_bytes()) all[ranks[n + i]] = base;
        }
        MPI_CHECK(MPI_Barrier(local));  // every beacon cleared before anyone reads one
    } else if (comm.beacons != MPI_WIN_NULL) {
        MPI_CHECK(MPI_Win_free(&comm.beacons));
    }
    int rc = !bad && rt_watchdog_attach(comm.rank, comm.world, all, err, errlen);
    plan_dealloc(all);
    plan_dealloc(ranks);
    return rc ? -1 : 0;
}

int rt_comm_init(RtRanks *r, char *err, size_t errlen)
{
    if (r->world == 1) return 0;
    int provided, rank, size;
    /* MULTIPLE so that the watchdog thread may call MPI_Abort while the main thread waits. */
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        return plan_fail(err, errlen, "MPI_Init failed (%s reported rank %d)", rt_launch_name(r->launch), r->rank);
    comm.up = 1;
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    comm.rank = rank, comm.world = size, comm.dp = size;
    snprintf(comm.who, sizeof comm.who, "rank %d", rank);
    if (r->world == 0) r->world = size, r->rank = rank;
    if (size != r->world || rank != r->rank)
        return plan_fail(err, errlen, "%s says rank %d of %d, but MPI sees rank %d of %d%s", rt_launch_name(r->launch),
                       r->rank, r->world, rank, size,
                       r->launch == RT_LAUNCH_SLURM ? " (srun must start MPI: srun --mpi=pmix, or pmi2)" : "");
    MPI_Comm local;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local));
    MPI_CHECK(MPI_Comm_rank(local, &r->local_rank));
    MPI_CHECK(MPI_Comm_size(local, &r->local_world));
    int rc = share_beacons(local, err, errlen);
    MPI_CHECK(MPI_Comm_free(&local));
    if (rc) return -1;
    MPI_CHECK(MPI_Op_create(sum_f16, 1, &comm.sum_f16));
    MPI_CHECK(MPI_Op_create(sum_bf16, 1, &comm.sum_bf16));
    return 0;
}

int rt_comm_rank(void) { return comm.rank; }
int rt_comm_world(void) { return comm.world; }
const char *rt_comm_who(void) { return comm.who; }

static void split(int color, MPI_Comm *out)
{
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, comm.rank, out));
    MPI_CHECK(MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN));
}

/* Hybrid sharding's groups: world rank r is data-parallel index d = r % dp of stage
 * r / dp, in shard group r / shard (consecutive ranks: dp is a multiple of shard) at
 * index d % shard, which with its stage names its replica group. */
static void split_hybrid(int dp, int shard)
{
    split(comm.rank / shard, &comm.group[OP_GROUP_SHARD]);
    split(comm.rank / dp * shard + comm.rank % dp % shard, &comm.group[OP_GROUP_REPLICA]);
}

int rt_comm_layout(int stages, int dp, int shard, char *err, size_t errlen)
{
    if (stages < 1 || dp < 1 || (int64_t)stages * dp != comm.world)
        return plan_fail(err, errlen, "%d stages x %d data-parallel ranks is not the world of %d", stages, dp,
                         comm.world);
    if (shard < 1 || dp % shard)
        return plan_fail(err, errlen, "a shard group of %d does not divide the %d data-parallel ranks", shard, dp);
    comm.stages = stages, comm.dp = dp;
    if (comm.up && shard > 1 && shard < dp) split_hybrid(dp, shard);
    if (stages == 1) return 0;
    snprintf(comm.who, sizeof comm.who, "rank %d, stage %d", comm.rank, comm.rank / dp);
    if (!comm.up) return 0;
    split(comm.rank / dp, &comm.group[OP_GROUP_DATA]);  // key: the world rank, so a group's ranks keep its order
    split(comm.rank % dp, &comm.group[OP_GROUP_PIPE]);
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm.p2p));
    MPI_CHECK(MPI_Comm_set_errhandler(comm.p2p, MPI_ERRORS_RETURN));
    return 0;
}

void rt_comm_finalize(void)
{
    if (!comm.up) return;
    for (int g = 0; g < OP_GROUP_COUNT; g++)
        if (comm.group[g] != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&comm.group[g]));
    if (comm.p2p != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&comm.p2p));
    if (comm.sum_f16 != MPI_OP_NULL) MPI_CHECK(MPI_Op_free(&comm.sum_f16));
    if (comm.sum_bf16 != MPI_OP_NULL) MPI_CHECK(MPI_Op_free(&comm.sum_bf16));
    rt_watchdog_detach();
    if (comm.beacons != MPI_WIN_NULL) MPI_CHECK(MPI_Win_free(&comm.beacons));
    comm.up = 0;
    MPI_CHECK(MPI_Finalize());
}

void rt_comm_abort(int code)
{
    fflush(stdout);
    if (comm.up) MPI_Abort(MPI_COMM_WORLD, code);
    _exit(code);
}

/* ---- blocking calls outside the step --------------------------------------------------- */

/* Before a blocking collective over the world (PLAN_NONE) or the stage's ranks
 * (RT_WAIT_STAGE): the watchdog hears of it as entered and waited for. */
static void blocking(const char *what, int32_t over)
{
    rt_watchdog_wait(rt_watchdog_enter(over), NULL, over, what);
}

void rt_comm_gather_f32(const float *send, int64_t n, float *recv)
{
    if (comm.dp == 1 || !comm.up) {
        memcpy(recv, send, sizeof *send * (size_t)n);
        return;
    }
    if (n > INT32_MAX) {
        fprintf(stderr, "[%s] %s:%d: a gather of %lld elements per rank exceeds MPI's int count\n", comm.who,
                short_path(__FILE__), __LINE__, (long long)n);
        rt_comm_abort(1);
    }
    blocking(comm.stages > 1 ? "a gather to the stage's first rank (MPI_Gather)" : "a gather to rank 0 (MPI_Gather)",
             RT_WAIT_STAGE);
    MPI_CHECK(MPI_Gather(send, (int)n, MPI_FLOAT, recv, (int)n, MPI_FLOAT, 0, group_comm(OP_GROUP_DATA)));
    rt_watchdog_waited();
}

int rt_comm_agree(int rc)
{
    return rt_comm_agree_on(rc, "the ranks' agreement on a result (MPI_Allreduce)");
}

int rt_comm_agree_on(int rc, const char *what)
{
    if (!comm.up) return rc;
    int worst;
    blocking(what, PLAN_NONE);
    MPI_CHECK(MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    rt_watchdog_waited();
    return worst;
}

void rt_comm_allgather_u64(const uint64_t *mine, int n, uint64_t *all)
{
    if (!comm.up) {
        memcpy(all, mine, sizeof *mine * (size_t)n);
        return;
    }
    blocking("an exchange of a few numbers between every rank (MPI_Allgather)", PLAN_NONE);
    MPI_CHECK(MPI_Allgather(mine, n, MPI_UINT64_T, all, n, MPI_UINT64_T, MPI_COMM_WORLD));
    rt_watchdog_waited();
}

void *rt_comm_gather_bytes(const void *mine, int64_t n, int64_t *sizes)
{
    int world = comm.up ? comm.world : 1;
    uint64_t mine_n = (uint64_t)n, *all = malloc(sizeof *all * (size_t)world);
    int *counts = malloc(sizeof *counts * (size_t)world), *at = malloc(sizeof *at * (size_t)world);
    uint64_t total = 0;
    if (all) rt_comm_allgather_u64(&mine_n, 1, all);
    for (int r = 0; r < world && all; r++) total += all[r];
    int fits = all && counts && at && total <= INT_MAX;
    if (comm.up) fits = !rt_comm_agree(!fits);
    char *out = fits && comm.rank == 0 ? malloc((size_t)total + 1) : NULL;
    if (fits && comm.rank == 0 && !out) fits = 0;
    if (comm.up) fits = !rt_comm_agree(!fits);
    for (int r = 0; r < world && fits; r++) {
        counts[r] = (int)all[r], at[r] = r ? at[r - 1] + counts[r - 1] : 0;
        if (sizes) sizes[r] = (int64_t)all[r];
    }
    if (fits && comm.up) {
        blocking("gathering every rank's bytes on rank 0 (MPI_Gatherv)", PLAN_NONE);
        MPI_CHECK(MPI_Gatherv(mine, (int)n, MPI_BYTE, out, counts, at, MPI_BYTE, 0, MPI_COMM_WORLD));
        rt_watchdog_waited();
    } else if (fits) {
        memcpy(out, mine, (size_t)n);
    }
    free(all), free(counts), free(at);
    if (!fits) free(out);
    return fits ? out : NULL;
}

int64_t rt_comm_sum_i64(int64_t v)
{
    if (!comm.up) return v;
    int64_t sum;
    blocking(comm.stages > 1 ? "a sum over the stage's ranks (MPI_Allreduce)" : "a sum over the ranks (MPI_Allreduce)",
             RT_WAIT_STAGE);
    MPI_CHECK(MPI_Allreduce(&v, &sum, 1, MPI_INT64_T, MPI_SUM, group_comm(OP_GROUP_DATA)));
    rt_watchdog_waited();
    return sum;
}

/* ---- the step's collectives: pure parts ------------------------------------------------ */

/* The op table names the collectives (ops.def's comm column); RtCollKind numbers them
 * as it does. */
_Static_assert((int)RT_COLL_ALL_REDUCE == (int)COMM_ALL_REDUCE && (int)RT_COLL_REDUCE_SCATTER == (int)COMM_REDUCE_SCATTER &&
                   (int)RT_COLL_ALL_GATHER == (int)COMM_ALL_GATHER && (int)RT_COLL_SEND == (int)COMM_SEND &&
                   (int)RT_COLL_RECV == (int)COMM_RECV,
               "RtCollKind is OpComm's collectives and point-to-point ops");

int rt_coll_kind(const char *op)
{
    OpComm k = op_comm_by_name(op);
    return k >= 0 && k < (int)RT_COLL_COUNT ? (int)k : -1;
}

int rt_ranges_overlap(const RtRange *a, int na, const RtRange *b, int nb)
{
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nb; j++)
            if (a[i].lo < a[i].hi && b[j].lo < b[j].hi && a[i].lo < b[j].hi && b[j].lo < a[i].hi) return 1;
    return 0;
}

int rt_coll_prepare(RtColl *c, RtCollKind kind, PlanDType dt, void *in, int64_t n_in, void *out, int64_t n_out,
                    int world, int rank, int avg, char *err, size_t errlen)
{
    const char *name = op_comm_name((OpComm)kind);
    if (kind == RT_COLL_SEND || kind == RT_COLL_RECV)
        return plan_fail(err, errlen, "%s is point-to-point (rt_p2p_prepare)", name);
    int64_t es = plan_dtype_size(dt), n = kind == RT_COLL_ALL_GATHER ? n_in : n_out;
    int sizes_ok = kind == RT_COLL_ALL_REDUCE ? n_in == n_out : kind == RT_COLL_REDUCE_SCATTER ? n_in == n_out * world
                                                                                                : n_out == n_in * world;
    if (!sizes_ok || es == 0)
        return plan_fail(err, errlen, "%s over %d ranks: %lld elements in, %lld out do not fit", name, world,
                       (long long)n_in, (long long)n_out);
    if (n > INT32_MAX)
        return plan_fail(err, errlen, "%s of %lld elements per rank exceeds MPI's int count", name, (long long)n);
    int reduces = kind != RT_COLL_ALL_GATHER;
    if (reduces && avg && dt == PLAN_DT_I32)
        return plan_fail(err, errlen, "%s with avg of i32: averages need a float dtype", name);
    uint8_t *x = in, *y = out;
    *c = (RtColl){.kind = kind, .dtype = dt, .in = in, .out = out, .n = n, .world = world, .avg = reduces && avg,
                  .slot = -1, .op = PLAN_NONE,
                  .range = {{(uintptr_t)x, (uintptr_t)(x + n_in * es)}, {(uintptr_t)y, (uintptr_t)(y + n_out * es)}}};
    if (!rt_ranges_overlap(&c->range[0], 1, &c->range[1], 1)) return 0;
    const char *why = NULL;
    switch (kind) {
    case RT_COLL_ALL_REDUCE:
        if (x == y) c->in_place = 1;
        else why = "the output overlaps the input without being it";
        break;
    case RT_COLL_REDUCE_SCATTER:
        if (c->range[1].lo >= c->range[0].lo && c->range[1].hi <= c->range[0].hi) c->in_place = 1, c->move_after = x != y;
        else why = "the output overlaps the input without lying inside it";
        break;
    case RT_COLL_ALL_GATHER:
        if (x == y + (int64_t)rank * n * es) c->in_place = 1;
        else why = "the input overlaps the output without being this rank's slice of it";
        break;
    case RT_COLL_SEND:
    case RT_COLL_RECV:
    case RT_COLL_COUNT: why = "unknown collective"; break;
    }
    return why ? plan_fail(err, errlen, "%s on rank %d: %s", name, rank, why) : 0;
}

int rt_p2p_prepare(RtColl *c, RtCollKind kind, PlanDType dt, void *buf, int64_t n, int peer, int sync, char *err,
                   size_t errlen)
{
    const char *name = kind == RT_COLL_SEND ? "send" : "recv";
    int64_t es = plan_dtype_size(dt);
    if ((kind != RT_COLL_SEND && kind != RT_COLL_RECV) || es == 0)
        return plan_fail(err, errlen, "%s of dtype %d: not a point-to-point op this fsexec runs", name, (int)dt);
    if (n > INT32_MAX)
        return plan_fail(err, errlen, "%s of %lld elements exceeds MPI's int count", name, (long long)n);
    uint8_t *x = buf;
    *c = (RtColl){.kind = kind, .dtype = dt, .in = buf, .out = buf, .n = n, .world = 2, .peer = peer,
                  .sync = kind == RT_COLL_SEND && sync, .slot = -1, .op = PLAN_NONE,
                  .range = {{(uintptr_t)x, (uintptr_t)(x + n * es)}, {0, 0}}};
    return 0;
}

/* ---- the step's collectives: the queue of pending ones ----------------------------------- */

struct RtCommQueue {
    int cap, n;
    MPI_Request *req;           // in flight
    const RtColl **coll;
    int64_t *seq;               // the watchdog's sequence number of each
    MPI_Request *persistent;    // set up by rt_comm_bind, RtColl.slot indexes it
    int n_persistent;
};

RtCommQueue *rt_comm_queue_new(int capacity)
{
    RtCommQueue *q = plan_alloc(sizeof *q);
    if (!q) return NULL;
    q->cap = capacity, q->n = 0;
    q->req = plan_alloc(sizeof *q->req * (size_t)(capacity + 1));
    q->coll = plan_alloc(sizeof *q->coll * (size_t)(capacity + 1));
    q->seq = plan_alloc(sizeof *q->seq * (size_t)(capacity + 1));
    q->persistent = plan_alloc(sizeof *q->persistent * (size_t)(capacity + 1));
    q->n_persistent = 0;
    if (!q->req || !q->coll || !q->seq || !q->persistent) {
        rt_comm_queue_free(q);
        return NULL;
    }
    return q;
}

void rt_comm_queue_free(RtCommQueue *q)
{
    if (!q) return;
    for (int i = 0; i < q->n_persistent && comm.up; i++) MPI_CHECK(MPI_Request_free(&q->persistent[i]));
    plan_dealloc(q->persistent);
    plan_dealloc(q->req);
    plan_dealloc(q->coll);
    plan_dealloc(q->seq);
    plan_dealloc(q);
}

int rt_comm_pending(const RtCommQueue *q) { return q ? q->n : 0; }

static MPI_Datatype mpi_type(PlanDType dt)
{
    switch (dt) {
    case PLAN_DT_F32: return MPI_FLOAT;
    case PLAN_DT_I32: return MPI_INT32_T;
    case PLAN_DT_F16:
    case PLAN_DT_BF16: return MPI_UINT16_T;  // reduced by sum_op's own ops
    case PLAN_DT_COUNT: break;
    }
    return MPI_BYTE;
}

static MPI_Op sum_op(PlanDType dt)
{
    return dt == PLAN_DT_F16 ? comm.sum_f16 : dt == PLAN_DT_BF16 ? comm.sum_bf16 : MPI_SUM;
}

/* Point-to-point ops are persistent requests wherever MPI runs (MPI_Send_init and its
 * kin are MPI 1), on the copy of the world that nothing else uses, with the op's tag:
 * the k-th send from a to b with a tag meets the k-th receive on b from a with that
 * tag, as the compiler ordered them. */
static void p2p(MPI_Request *r, const RtColl *c, int persistent)
{
    MPI_Datatype t = mpi_type(c->dtype);
    MPI_Comm w = comm.p2p != MPI_COMM_NULL ? comm.p2p : MPI_COMM_WORLD;
    int n = (int)c->n, tag = c->tag;
    if (c->kind == RT_COLL_RECV && persistent) MPI_CHECK(MPI_Recv_init(c->out, n, t, c->peer, tag, w, r));
    else if (c->kind == RT_COLL_RECV) MPI_CHECK(MPI_Irecv(c->out, n, t, c->peer, tag, w, r));
    else if (c->sync && persistent) MPI_CHECK(MPI_Ssend_init(c->in, n, t, c->peer, tag, w, r));
    else if (c->sync) MPI_CHECK(MPI_Issend(c->in, n, t, c->peer, tag, w, r));
    else if (persistent) MPI_CHECK(MPI_Send_init(c->in, n, t, c->peer, tag, w, r));
    else MPI_CHECK(MPI_Isend(c->in, n, t, c->peer, tag, w, r));
}

void rt_comm_bind(RtCommQueue *q, RtColl *c)
{
    if (q->n_persistent >= q->cap) return;  // stays nonblocking
    MPI_Request *r = &q->persistent[q->n_persistent];
    if (c->kind == RT_COLL_SEND || c->kind == RT_COLL_RECV) {
        p2p(r, c, 1);
        c->slot = q->n_persistent++;
        return;
    }
#if PERSISTENT
    MPI_Datatype t = mpi_type(c->dtype);
    MPI_Comm g = group_comm(c->group);
    int n = (int)c->n;
    switch (c->kind) {
    case RT_COLL_ALL_REDUCE:
        MPI_CHECK(ALLREDUCE_INIT(c->in_place ? MPI_IN_PLACE : c->in, c->out, n, t, sum_op(c->dtype), g, MPI_INFO_NULL,
                                 r));
        break;
    case RT_COLL_REDUCE_SCATTER:
        MPI_CHECK(REDUCE_SCATTER_BLOCK_INIT(c->in_place ? MPI_IN_PLACE : c->in, c->in_place ? c->in : c->out, n, t,
                                            sum_op(c->dtype), g, MPI_INFO_NULL, r));
        break;
    case RT_COLL_ALL_GATHER:
        MPI_CHECK(ALLGATHER_INIT(c->in_place ? MPI_IN_PLACE : c->in, n, t, c->out, n, t, g, MPI_INFO_NULL, r));
        break;
    default: return;
    }
    c->slot = q->n_persistent++;
#else
    c->slot = -1;
#endif
}

void rt_comm_start(RtCommQueue *q, const RtColl *c)
{
    if (q->n >= q->cap) {
        fprintf(stderr, "[%s] %s:%d: more collectives in flight than the plan has (%d)\n", comm.who,
                short_path(__FILE__), __LINE__, q->cap);
        rt_comm_abort(1);
    }
    MPI_Datatype t = mpi_type(c->dtype);
    MPI_Request *r = &q->req[q->n];
    int n = (int)c->n;
    q->seq[q->n] = rt_watchdog_enter(c->op);
    if (c->slot >= 0) {
        MPI_CHECK(MPI_Start(&q->persistent[c->slot]));
        *r = q->persistent[c->slot];  // the same request: testing it leaves it inactive, not freed
        q->coll[q->n++] = c;
        return;
    }
    MPI_Comm g = group_comm(c->group);
    switch (c->kind) {
    case RT_COLL_ALL_REDUCE:
        MPI_CHECK(MPI_Iallreduce(c->in_place ? MPI_IN_PLACE : c->in, c->out, n, t, sum_op(c->dtype), g, r));
        break;
    case RT_COLL_REDUCE_SCATTER:
        if (c->in_place)
            MPI_CHECK(MPI_Ireduce_scatter_block(MPI_IN_PLACE, c->in, n, t, sum_op(c->dtype), g, r));
        else
            MPI_CHECK(MPI_Ireduce_scatter_block(c->in, c->out, n, t, sum_op(c->dtype), g, r));
        break;
    case RT_COLL_ALL_GATHER:
        MPI_CHECK(MPI_Iallgather(c->in_place ? MPI_IN_PLACE : c->in, n, t, c->out, n, t, g, r));
        break;
    case RT_COLL_SEND:
    case RT_COLL_RECV: p2p(r, c, 0); break;
    case RT_COLL_COUNT: return;
    }
    q->coll[q->n++] = c;
}

/* The request at i has completed: finish its collective and drop it from the queue. */
static void finish(RtCommQueue *q, int i)
{
    const RtColl *c = q->coll[i];
    size_t bytes = (size_t)c->n * (size_t)plan_dtype_size(c->dtype);
    if (c->done_at) *c->done_at = rt_now();
    if (c->move_after) memmove(c->out, c->in, bytes);
    if (c->avg) {
        float w = (float)(c->avg_over > 0 ? c->avg_over : c->world);
        uint16_t *h = c->out;
        if (c->dtype == PLAN_DT_F32)
            for (float *y = c->out, *end = y + c->n; y < end; y++) *y /= w;
        else if (c->dtype == PLAN_DT_F16)
            for (int64_t k = 0; k < c->n; k++) h[k] = cpu_f32_to_f16(cpu_f16_to_f32(h[k]) / w);
        else
            for (int64_t k = 0; k < c->n; k++) h[k] = cpu_f32_to_bf16(cpu_bf16_to_f32(h[k]) / w);
    }
    q->n--;
    q->req[i] = q->req[q->n];
    q->coll[i] = q->coll[q->n];
    q->seq[i] = q->seq[q->n];
}

/* Blocks until request i completes, the watchdog told which collective this rank waits in. */
static void wait_one(RtCommQueue *q, int i)
{
    rt_watchdog_wait(q->seq[i], q->coll[i]->plan, q->coll[i]->op, NULL);
    MPI_CHECK(MPI_Wait(&q->req[i], MPI_STATUS_IGNORE));
    rt_watchdog_waited();
    finish(q, i);
}

void rt_comm_poll(RtCommQueue *q)
{
    for (int i = q->n - 1; i >= 0; i--) {
        int done = 0;
        MPI_CHECK(MPI_Test(&q->req[i], &done, MPI_STATUS_IGNORE));
        if (done) finish(q, i);
    }
}

void rt_comm_wait_for(RtCommQueue *q, const RtColl *c)
{
    for (int i = q->n - 1; i >= 0; i--)
        if (q->coll[i] == c) {
            wait_one(q, i);
            return;
        }
}

void rt_comm_wait_all(RtCommQueue *q)
{
    for (int i = q->n - 1; i >= 0; i--) wait_one(q, i);
}
