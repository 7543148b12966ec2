/* planner/cost.c: the modelled step time of a plan, and a lower bound on it from the
 * model's facts alone (so that the search need not compile what cannot win).
 *
 * Each op of a stage's program takes:
 *   compute on the device   max(FLOPs / peak(dtype), bytes / hbm_bw)   (a roofline; views 0)
 *   compute on the host     max(FLOPs / host_flops, bytes / host_bw)   (offload's update)
 *   a collective            ring bytes / link + latency; link: NVLink when the group's
 *                           ranks share a node of gpus_per_node, else IB
 *   a send or receive       bytes / link between the two ranks + latency
 *   a host-device copy      bytes / pcie_bw
 * where FLOPs are ir/flops.c's (PlanOp.flops), bytes every input and output, and ring
 * bytes report/comm.c's (comm_op_bytes). The streams run as the schedule stored them:
 * compute ops in order, each after the off-stream ops it waits for; an op on another
 * stream after every compute op before it and the previous op of its stream. A stage
 * takes until its last stream is done; the step takes the busiest stage's time times
 * makespan / ideal of the timeline (report/timeline.c: its bubble).
 */
#include <string.h>

#include "planner.h"
#include "report.h"

static int is_16bit(PlanDType d) { return d == PLAN_DT_F16 || d == PLAN_DT_BF16; }

/* Whether the ranks a .. a + (n - 1) * stride are on one node. */
static int one_node(int64_t a, int64_t n, int64_t stride, int g)
{
    return a / g == (a + (n - 1) * stride) / g;
}

static double link_bw(const Machine *m, int same_node) { return same_node ? m->nvlink_bw : m->ib_bw; }

/* The op table's row of each op name of a plan, found once per name (string id). */
typedef struct {
    const OpInfo **info;
    uint8_t *found;
} Names;

static const OpInfo *info_of(Names *nm, const Plan *p, const PlanOp *op)
{
    if (!nm->found[op->op]) nm->info[op->op] = op_info_by_name(plan_str(p, op->op)), nm->found[op->op] = 1;
    return nm->info[op->op];
}

static double op_time(const Machine *m, const Plan *p, const PlanProgram *pr, const PlanOp *op, Names *nm)
{
    const OpInfo *info = info_of(nm, p, op);
    OpComm k = info && info->comm != COMM_NONE ? report_op_comm(p, op) : COMM_NONE;
    int64_t dp = pr->dp_world, first = (int64_t)pr->stage * dp;
    int G = m->gpus_per_node;
    if (k == COMM_TO_HOST || k == COMM_TO_DEVICE) return comm_op_bytes(p, op, dp) / m->pcie_bw;
    if (k == COMM_SEND || k == COMM_RECV) {
        int64_t peer = report_op_int(p, op, "peer", pr->stage) * dp;
        int same = 1;
        for (int64_t i = 0; i < dp; i++) same &= first / G == (peer + i) / G && (first + i) / G == (peer + i) / G;
        return comm_op_bytes(p, op, dp) / link_bw(m, same) + m->collective_latency;
    }
    if (k != COMM_NONE) {
        double b = comm_op_bytes(p, op, dp);
        int64_t group = report_op_int(p, op, "group", OP_GROUP_DATA), S = plan_shard_group(p, dp);
        /* Rank 0 of the stage's groups: the pipeline's stages dp apart; hybrid sharding's
         * shard group S consecutive ranks, its replica group dp / S ranks S apart. */
        int same = group == OP_GROUP_PIPE      ? one_node(0, p->n_programs, dp, G)
                   : group == OP_GROUP_SHARD   ? one_node(first, S, 1, G)
                   : group == OP_GROUP_REPLICA ? one_node(first, dp / S, S, G)
                                               : one_node(first, dp, 1, G);
        return b > 0 ? b / link_bw(m, same) + m->collective_latency : 0;
    }
    if (info && (info->flags & OPF_VIEW)) return 0;
    if (info == op_info(OP_buffer)) return 0;  // no kernel: its views' producers write its bytes
    double bytes = 0;
    int host = 0;
    PlanDType dt = PLAN_DT_F32;
    for (int32_t i = 0; i < op->n_in + op->n_out; i++) {
        const PlanTensor *t = &p->tensors[p->ids[i < op->n_in ? op->in + i : op->out + i - op->n_in]];
        bytes += (double)plan_tensor_nbytes(t);
        host |= t->place == PLAN_PLACE_HOST;
        if (i == (op->n_out ? op->n_in : 0)) dt = t->dtype;  // the first output's (else the first input's)
    }
    if (host) {
        double a = op->flops / m->host_flops, b = bytes / m->host_bw;
        return a > b ? a : b;
    }
    return cost_roofline(m, op->flops, bytes, is_16bit(dt));
}

double cost_roofline(const Machine *m, double flops, double bytes, int is16)
{
    double a = flops / (is16 ? m->flops_16bit : m->flops_fp32), b = bytes / m->hbm_bw;
    return a > b ? a : b;
}

/* One stage's program on its three streams. */
static Cost stage_cost(const Machine *m, const Plan *p, int32_t k, double *end, Names *nm)
{
    const PlanProgram *pr = &p->programs[k];
    double clock[PLAN_STREAM_COUNT] = {0}, busy[PLAN_STREAM_COUNT] = {0};
    Cost c = {0};
    for (int32_t i = pr->first_op; i < pr->first_op + pr->n_ops; i++) {
        const PlanOp *op = &p->ops[i];
        double d = op_time(m, p, pr, op, nm), start = clock[op->stream];
        if (op->stream == PLAN_STREAM_COMPUTE) {
            for (int32_t w = 0; w < op->n_wait; w++)
                if (end[p->waits[op->wait + w]] > start) start = end[p->waits[op->wait + w]];
        } else if (clock[PLAN_STREAM_COMPUTE] > start) {
            start = clock[PLAN_STREAM_COMPUTE];
        }
        end[i] = start + d;
        clock[op->stream] = end[i];
        busy[op->stream] += d;
    }
    for (int s = 0; s < PLAN_STREAM_COUNT; s++)
        if (clock[s] > c.time) c.time = clock[s];
    c.compute = busy[PLAN_STREAM_COMPUTE], c.comm = busy[PLAN_STREAM_COLLECTIVE], c.copy = busy[PLAN_STREAM_COPY];
    c.exposed = c.time - c.compute;
    return c;
}

int cost_plan(const Machine *m, const Plan *p, Cost *out, char *err, size_t errlen)
{
    double *end = plan_alloc(sizeof *end * (size_t)(p->n_ops ? p->n_ops : 1));
    Names nm = {plan_alloc(sizeof *nm.info * (size_t)(p->n_strs + 1)), plan_alloc((size_t)p->n_strs + 1)};
    if (!end || !nm.info || !nm.found) {
        plan_dealloc(end), plan_dealloc(nm.info), plan_dealloc(nm.found);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memset(nm.found, 0, (size_t)p->n_strs + 1);
    *out = (Cost){0};
    for (int32_t k = 0; k < p->n_programs; k++) {
        Cost c = stage_cost(m, p, k, end, &nm);
        if (c.time > out->time) *out = c;
    }
    plan_dealloc(end), plan_dealloc(nm.info), plan_dealloc(nm.found);
    if (p->n_programs < 2) return 0;
    Timeline *tl = report_timeline_new(p, TL_COST_FLOPS, err, errlen);
    if (!tl) return -1;
    out->bubble = tl->bubble;
    if (tl->ideal > 0) out->time *= tl->makespan / tl->ideal;
    report_timeline_free(tl);
    return 0;
}

/* Whether blocks of times w[0..n) (each a whole block, in order) go on at most P stages,
 * the last also taking `last`, with no stage over x: packed from the last stage back,
 * each stage as full as it goes (which needs the fewest stages; with n >= P a stage of
 * several blocks splits into more, none fuller). */
static int fits_stages(const double *w, int n, int P, double last, double x)
{
    int stages = 1, blocks = 0;
    double cur = last;
    for (int i = n - 1; i >= 0; i--) {
        if (w[i] > x) return 0;
        if (cur + w[i] > x) {
            if (!blocks) return 0;  // the last stage cannot hold a block beside `last`
            stages++, cur = 0, blocks = 0;
        }
        cur += w[i], blocks++;
    }
    return blocks > 0 && stages <= P;
}

/* The least time of the busiest of P stages of whole blocks w[0..n) in order, the last
 * stage also taking `last` (n >= P): at or below the optimum, by bisection. */
static double busiest_stage(const double *w, int n, int P, double last)
{
    double total = last, most = 0;
    for (int i = 0; i < n; i++) total += w[i], most = w[i] > most ? w[i] : most;
    double lo = total / P > most ? total / P : most, hi = total;
    if (fits_stages(w, n, P, last, lo)) return lo;
    for (int it = 0; it < 60 && hi - lo > 1e-9 * hi; it++) {
        double mid = (lo + hi) / 2;
        if (fits_stages(w, n, P, last, mid)) hi = mid;
        else lo = mid;
    }
    return lo;
}

/* The bound, term by term (docs/planner.md):
 *   compute  the facts' roofline time of the forward and backward (and of the forward
 *            of recomputed blocks) / world, over 1 - bubble: the bubble of balanced
 *            stages, (S - 1) / (m x chunks + S - 1), at 90% (the step's own work shortens
 *            the timeline's a little), ZB-H1's a third of it; and with stages at least
 *            the busiest stage's share: the best cut of the blocks (each with what it
 *            recomputes) into S x chunks runs, the head's and the loss's ops on the
 *            last, over the stage's data-parallel ranks
 *   host     offload: this rank's params x 8 bytes (the fp32 master read and written) / host_bw
 *   comm     the strategy's collectives over the params of a stage: ddp an all-reduce
 *            of the grads, zero1 that and a gather, zero2 and fsdp a reduce-scatter and a gather,
 *            at (dp - 1) / dp of their bytes, over stage 0's link
 *   copies   offload: this rank's params x 2 x the compute dtype's width / pcie_bw
 * and the bound is max(compute + host, comm, copies). */
double cost_lower_bound(const Machine *m, const Space *s, const Cand *c)
{
    const ModelFacts *f = &s->facts;
    int64_t S = space_num(s, c, AX_STAGES), mb = space_num(s, c, AX_MICROBATCHES), dp = s->world / S;
    int64_t k = space_num(s, c, AX_RECOMPUTE);
    const char *prec = space_value(s, c, AX_PRECISION), *shard = space_value(s, c, AX_SHARD);
    int fp32 = !strcmp(prec, "fp32");
    /* The pipeline's checkpoint recomputes the share of a stage's forward of some micro-batches. */
    double share = S < 2 ? 0 : f->checkpoint == CKPT_ALWAYS ? 1 : f->checkpoint == CKPT_EXCEPT_LAST ? (double)(mb - 1) / mb : 0;
    double rec = 0, all_fwd = 0;
    for (int b = 0; b < f->n_blocks; b++) {
        all_fwd += f->block_time[!fp32][b];
        if (b < k) rec += f->block_time[!fp32][b];
    }
    if (share * all_fwd > rec) rec = share * all_fwd;
    double compute = (f->step_time[!fp32] + rec) / s->world;
    if (S > 1) {
        const char *sched = space_value(s, c, AX_SCHEDULE);
        double v = !strcmp(sched, "interleaved") ? 2 : 1;
        double bubble = 0.9 * (double)(S - 1) / ((double)mb * v + (double)(S - 1));
        if (!strcmp(sched, "zb1")) bubble /= 3;
        compute /= 1 - bubble;
        double w[1024] = {0};
        for (int b = 0; b < f->n_blocks; b++) w[b] = f->block_step[!fp32][b] + (b < k ? 1 : share) * f->block_time[!fp32][b];
        /* With chunks, a stage holds v runs: at least the busiest run, and the last
         * stage the head beside its v runs of a block or more each. */
        double least = f->n_blocks ? w[0] : 0;
        for (int b = 0; b < f->n_blocks; b++) least = w[b] < least ? w[b] : least;
        double busiest = f->n_blocks >= S * v ? busiest_stage(w, f->n_blocks, (int)(S * v), f->last_time[!fp32]) : 0;
        if (v > 1 && f->last_time[!fp32] + v * least > busiest) busiest = f->last_time[!fp32] + v * least;
        if (busiest / (double)dp > compute) compute = busiest / (double)dp;
    }
    int sharded = strcmp(shard, "none") && strcmp(shard, "ddp");
    double stage_params = (double)f->params / (double)S, rank_params = stage_params / (sharded ? (double)dp : 1);
    const char *off = space_value(s, c, AX_OFFLOAD);
    double width = fp32 ? 4 : 2, reduce = !fp32 && !strcmp(space_value(s, c, AX_REDUCE), "fp32") ? 4 : width;
    double host = 0, copies = 0, comm = 0;
    if (strcmp(off, "none")) {
        host = rank_params * 8 / m->host_bw;
        copies = rank_params * 2 * width / m->pcie_bw;
    }
    if (dp > 1) {
        double ring = (double)(dp - 1) / (double)dp, bytes = 0;
        if (!strcmp(shard, "ddp")) bytes = 2 * reduce;
        if (!strcmp(shard, "zero1")) bytes = 2 * reduce + width;
        if (!strcmp(shard, "zero2") || !strcmp(shard, "fsdp")) bytes = reduce + width;
        int64_t g = sharded && space_applies(s, c, AX_SHARD_GROUP) ? space_num(s, c, AX_SHARD_GROUP) : 0;
        if (g > 1 && g < dp) {  // hybrid: the above within the group of g, the shards' all-reduce across
            double r = (double)(dp / g);
            comm = stage_params * bytes * (double)(g - 1) / (double)g / link_bw(m, one_node(0, g, 1, m->gpus_per_node)) +
                   stage_params / (double)g * 2 * reduce * (r - 1) / r / link_bw(m, one_node(0, dp / g, g, m->gpus_per_node));
        } else {
            comm = stage_params * bytes * ring / link_bw(m, one_node(0, dp, 1, m->gpus_per_node));
        }
    }
    double t = compute + host;
    if (comm > t) t = comm;
    if (copies > t) t = copies;
    return t;
}
