/* report/comm.c: what a plan sends, per rank and step: every collective with its bytes,
 * and between pipeline stages, the point-to-point bytes by peer.
 *
 * Bytes follow the ZeRO paper's accounting, per rank, for a buffer of Psi bytes (the
 * whole flat buffer, padding included): an all-reduce moves 2 Psi (a reduce-scatter then
 * an all-gather), a reduce-scatter Psi and an all-gather Psi. So DDP moves 2 Psi a step,
 * zero1 3 Psi (FairScale's OSS: it all-reduces the gradients, then all-gathers the
 * updated shards; ZeRO's P_os reduce-scatters them, 2 Psi), zero2 2 Psi, and fsdp 3 Psi:
 * 1.5 times DDP, less the params outside blocks, which it gathers once a step (and keeps
 * from forward to backward). Psi is in the dtype the plan moves (16-bit under mixed
 * precision); tests/unit/test_zero_formulas.c holds these at scale. This payload is the
 * one total (README's figures are it); what a ring algorithm sends of it, (group - 1) /
 * group, is listed beside it. Each collective says what it serves (a forward, backward
 * or update gather, a gradient reduction, a scalar's sum), found from the phase of the
 * op that made its input and of the first op that reads its output (zero1's and zero2's
 * gathers: of the updated shards). A collective's group is
 * its stage's data-parallel ranks, or (group 1) the pipeline group: one rank per stage,
 * or hybrid sharding's shard group (2) or replica group (3), whose bytes are totalled
 * apart: within the shard groups and across them, with the across-hosts formula
 * 2M(W-S)/(SW) beside the ring's measured sends (see CommTotals).
 * A send moves its tensor's bytes once, to its peer; a receive takes its output's. A
 * copy between the device and the host (offload) moves its tensor's bytes once, over the
 * rank's own host link: it is listed apart from what goes between ranks.
 *
 * A plan of several programs is reported per stage: each stage's ranks run its program
 * alone. A plan of one program (or none: every op) is reported as it always was.
 *
 * Which ops are collectives, and which, is the op table's to say (ops.def's comm column).
 */
#include <string.h>

#include "report.h"

enum { MAX_PEERS_SHOWN = 64 };

/* Per-rank traffic of collective k in units of the buffer's full size; 0 for any other
 * op. A switch without a default: a new kind in OpComm is a warning here until it has
 * its line. */
static double factor_of(OpComm k)
{
    switch (k) {
    case COMM_ALL_REDUCE: return 2.0;
    case COMM_REDUCE_SCATTER:
    case COMM_ALL_GATHER: return 1.0;
    case COMM_SEND:  // point-to-point: not a collective (counted on their own)
    case COMM_RECV:
    case COMM_TO_HOST:  // within the rank: counted on their own
    case COMM_TO_DEVICE:
    case COMM_NONE:
    case COMM_COUNT: break;
    }
    return 0;
}

static int is_p2p(OpComm k) { return k == COMM_SEND || k == COMM_RECV; }
static int is_copy(OpComm k) { return k == COMM_TO_HOST || k == COMM_TO_DEVICE; }

/* The full buffer: the larger of input and output (an all-reduce's are equal, a
 * reduce-scatter's input and an all-gather's output hold every rank's part). */
static int64_t full_bytes(const Plan *p, const PlanOp *op)
{
    int64_t in = plan_tensor_nbytes(&p->tensors[p->ids[op->in]]), out = plan_tensor_nbytes(&p->tensors[p->ids[op->out]]);
    return in > out ? in : out;
}

/* What a send sends (its input) or a receive receives (its output). */
static int64_t p2p_bytes(const Plan *p, const PlanOp *op, OpComm k)
{
    return plan_tensor_nbytes(&p->tensors[p->ids[k == COMM_SEND ? op->in : op->out]]);
}

/* The ops [a, e) of one stage of dp_world data-parallel ranks. */
static CommTotals totals_of(const Plan *p, int32_t a, int32_t e, int64_t dp_world)
{
    CommTotals c = {.world = dp_world, .shard = plan_shard_group(p, dp_world)};
    for (int32_t i = a; i < e; i++) {
        const PlanOp *op = &p->ops[i];
        OpComm k = report_op_comm(p, op);
        if (k == COMM_NONE) continue;
        if (is_copy(k)) {
            double b = (double)plan_tensor_nbytes(&p->tensors[p->ids[op->in]]);
            c.copies++;
            *(k == COMM_TO_HOST ? &c.to_host_bytes : &c.to_device_bytes) += b;
            continue;
        }
        if (is_p2p(k)) {
            double b = (double)p2p_bytes(p, op, k);
            if (k == COMM_SEND) c.sends++, c.send_bytes += b;
            if (k == COMM_RECV) c.recvs++, c.recv_bytes += b;
            continue;
        }
        int64_t group = report_group_size(p, op, dp_world);
        double b = factor_of(k) * (double)full_bytes(p, op);
        double ring = group > 1 ? b * (double)(group - 1) / (double)group : 0;
        int64_t which = report_op_int(p, op, "group", OP_GROUP_DATA);
        c.collectives++;
        c.bytes += b;
        c.ring_bytes += ring;
        if (which == OP_GROUP_SHARD) c.within_bytes += b;
        if (which == OP_GROUP_REPLICA)
            c.across_bytes += b, c.across_ring_bytes += ring, c.across_grad_bytes += (double)(full_bytes(p, op) * c.shard);
    }
    return c;
}

CommTotals comm_totals_stage(const Plan *p, int32_t k)
{
    const PlanProgram *g = &p->programs[k];
    return totals_of(p, g->first_op, g->first_op + g->n_ops, g->dp_world);
}

CommTotals comm_totals(const Plan *p)
{
    if (p->n_programs > 1) return comm_totals_stage(p, 0);
    return totals_of(p, 0, p->n_ops, plan_meta_int(p, "world", 1));
}

static const char *what_of(const Plan *p, const PlanOp *op)
{
    int32_t t = p->ids[op->out];
    const char *name = plan_str(p, p->tensors[t].name);
    if (*name) return name;
    name = plan_str(p, p->tensors[p->ids[op->in]].name);
    return *name ? name : "";
}

/* Whether op reads tensor t or a view of it. */
static int reads(const Plan *p, const PlanOp *op, int32_t t)
{
    for (int32_t j = 0; j < op->n_in; j++) {
        int32_t u = p->ids[op->in + j];
        if (u == t || p->tensors[u].alias == t) return 1;
    }
    return 0;
}

/* The phase of the first op of [a, e) after op i that reads what i makes, in program
 * order and then (what the next step reads: zero1's updated params) from a; -1 if none. */
static int reader_phase(const Plan *p, int32_t a, int32_t e, int32_t i)
{
    int32_t t = p->ids[p->ops[i].out];
    if (p->tensors[t].alias != PLAN_NONE) t = p->tensors[t].alias;  // gathered in place: the params are views of it
    for (int32_t n = 1; n < e - a; n++) {
        const PlanOp *op = &p->ops[a + (i - a + n) % (e - a)];
        if (reads(p, op, t)) return (int)op->phase;
    }
    return -1;
}

/* What a collective serves, from what it reads and who reads what it makes: a gather
 * of the optimizer's updated shards (zero1 and zero2 gather each param once a step for
 * that, whatever reads it first), or fsdp's for the forward or the backward (or its
 * recompute); a gradient's reduction; a scalar's sum (the loss, the gradient norm). */
static const char *purpose_of(const Plan *p, int32_t a, int32_t e, int32_t i, OpComm k)
{
    const PlanOp *op = &p->ops[i];
    const PlanTensor *in = &p->tensors[p->ids[op->in]];
    const PlanTensor *root = in->alias == PLAN_NONE ? in : &p->tensors[in->alias];
    int made = root->producer == PLAN_NONE ? -1 : (int)p->ops[root->producer].phase;
    if (k == COMM_ALL_GATHER) {
        const char *shard = plan_meta_str(p, "shard", "none");
        if (made == PLAN_PHASE_OPTIMIZER || !strcmp(shard, "zero1") || !strcmp(shard, "zero2")) return "update gather";
        int r = reader_phase(p, a, e, i);
        return r == PLAN_PHASE_FORWARD ? "forward gather" : r < 0 ? "gather" : "backward gather";
    }
    if (plan_tensor_numel(in) == 1) return made == PLAN_PHASE_FORWARD ? "loss sum" : "grad-norm sum";
    return in->role == PLAN_ROLE_GRAD || made == PLAN_PHASE_BACKWARD || made == PLAN_PHASE_WGRAD ? "grad reduction"
                                                                                                : "reduction";
}

static void print_collectives(const Plan *p, int32_t a, int32_t e, int64_t dp_world, FILE *out)
{
    char b0[32], b1[32], b2[32];
    fprintf(out, "  %5s  %-14s %-28s %-16s %14s %11s %11s\n", "op", "collective", "buffer", "serves", "payload, bytes",
            "payload", "ring sends");
    for (int32_t i = a; i < e; i++) {
        const PlanOp *op = &p->ops[i];
        OpComm k = report_op_comm(p, op);
        if (k == COMM_NONE || is_p2p(k) || is_copy(k)) continue;
        int64_t group = report_group_size(p, op, dp_world);
        double b = factor_of(k) * (double)full_bytes(p, op);
        double ring = group > 1 ? b * (double)(group - 1) / (double)group : 0;
        fprintf(out, "  %5d  %-14s %-28s %-16s %14s %11s %11s", i, op_comm_name(k), what_of(p, op),
                purpose_of(p, a, e, i, k), report_grouped((int64_t)b, b0, sizeof b0),
                report_bytes((int64_t)b, b1, sizeof b1), report_bytes((int64_t)ring, b2, sizeof b2));
        int64_t which = report_op_int(p, op, "group", OP_GROUP_DATA);
        if (which == OP_GROUP_PIPE)
            fprintf(out, "  over the pipeline group (%lld ranks, one per stage)", (long long)group);
        if (which == OP_GROUP_SHARD) fprintf(out, "  within the shard group (%lld ranks)", (long long)group);
        if (which == OP_GROUP_REPLICA) fprintf(out, "  across the shard groups (%lld replicas)", (long long)group);
        fputc('\n', out);
    }
}

typedef struct {
    int64_t peer;
    int sends, recvs;
    double send_bytes, recv_bytes;
} Peer;

/* Sends and receives of ops [a, e) by peer, in the order peers first appear. */
static void print_p2p(const Plan *p, int32_t a, int32_t e, FILE *out)
{
    Peer peers[MAX_PEERS_SHOWN];
    int n = 0, more = 0;
    for (int32_t i = a; i < e; i++) {
        OpComm k = report_op_comm(p, &p->ops[i]);
        if (!is_p2p(k)) continue;
        int64_t peer = report_op_int(p, &p->ops[i], "peer", -1);
        int at = 0;
        while (at < n && peers[at].peer != peer) at++;
        if (at == n && n == MAX_PEERS_SHOWN) {
            more++;
            continue;
        }
        if (at == n) peers[n++] = (Peer){.peer = peer};
        double b = (double)p2p_bytes(p, &p->ops[i], k);
        if (k == COMM_SEND) peers[at].sends++, peers[at].send_bytes += b;
        if (k == COMM_RECV) peers[at].recvs++, peers[at].recv_bytes += b;
    }
    fprintf(out, "  point-to-point, by peer (each rank with the rank of the peer stage at its data-parallel index):\n");
    fprintf(out, "    %-10s %7s %12s %9s %12s\n", "peer", "sends", "sent", "receives", "received");
    for (int i = 0; i < n; i++) {
        char who[32], b1[32], b2[32];
        snprintf(who, sizeof who, "stage %lld", (long long)peers[i].peer);
        fprintf(out, "    %-10s %7d %12s %9d %12s\n", who, peers[i].sends,
                report_bytes((int64_t)peers[i].send_bytes, b1, sizeof b1), peers[i].recvs,
                report_bytes((int64_t)peers[i].recv_bytes, b2, sizeof b2));
    }
    if (more) fprintf(out, "    (%d more ops to peers not shown)\n", more);
}

/* The copies of ops [a, e) between the device and the host, one line each. */
static void print_copies(const Plan *p, int32_t a, int32_t e, FILE *out)
{
    fprintf(out, "  between device and host (offload), over the rank's own link:\n");
    fprintf(out, "  %5s  %-14s %-28s %-10s %12s\n", "op", "copy", "buffer", "phase", "bytes");
    for (int32_t i = a; i < e; i++) {
        const PlanOp *op = &p->ops[i];
        OpComm k = report_op_comm(p, op);
        if (!is_copy(k)) continue;
        char b[32];
        fprintf(out, "  %5d  %-14s %-28s %-10s %12s\n", i, op_comm_name(k), what_of(p, op), plan_phase_name(op->phase),
                report_bytes(plan_tensor_nbytes(&p->tensors[p->ids[op->in]]), b, sizeof b));
    }
}

/* "1,234 bytes (1.2 KiB)" */
static const char *exact(double v, char *buf, size_t n)
{
    char g[32], b[32];
    snprintf(buf, n, "%s bytes (%s)", report_grouped((int64_t)v, g, sizeof g), report_bytes((int64_t)v, b, sizeof b));
    return buf;
}

static void print_totals(const CommTotals *c, FILE *out)
{
    char a[64], b[64];
    if (c->collectives || !c->copies)
        fprintf(out, "  total: %d collectives, payload %s per rank and step; a ring algorithm sends %s of it\n",
                c->collectives, exact(c->bytes, a, sizeof a), exact(c->ring_bytes, b, sizeof b));
    if (c->sends || c->recvs)
        fprintf(out, "  point-to-point: %d sends, %s; %d receives, %s\n", c->sends, exact(c->send_bytes, a, sizeof a),
                c->recvs, exact(c->recv_bytes, b, sizeof b));
    if (c->copies)
        fprintf(out, "  device <-> host: %d copies, %s to the host, %s to the device\n", c->copies,
                exact(c->to_host_bytes, a, sizeof a), exact(c->to_device_bytes, b, sizeof b));
    if (!c->within_bytes && !c->across_bytes) return;
    long long S = (long long)c->shard, W = (long long)c->world;
    double M = c->across_grad_bytes, formula = 2 * M * (double)(W - S) / ((double)S * (double)W);
    fprintf(out, "  hybrid sharding, shard_group %lld of %lld ranks (%lld groups of %lld, each shard on %lld replicas):\n",
            S, W, W / S, S, W / S);
    fprintf(out, "    within the shard groups: payload %s (gathers, reduce-scatters)\n", exact(c->within_bytes, a, sizeof a));
    fprintf(out, "    across the groups: payload %s (the gradient shards' all-reduces); a ring sends %s of it\n",
            exact(c->across_bytes, a, sizeof a), exact(c->across_ring_bytes, b, sizeof b));
    fprintf(out, "    across hosts (a host per shard group): 2M(W-S)/(SW) = %s, M = %s of gradients, W = %lld, S = %lld\n",
            exact(formula, a, sizeof a), exact(M, b, sizeof b), W, S);
}

/* The report of ops [a, e), under a heading that names their ranks. */
static void report_ops(const Plan *p, int32_t a, int32_t e, const CommTotals *c, FILE *out)
{
    if (!c->collectives && !c->sends && !c->recvs && !c->copies) {
        fprintf(out, "  none\n");
        return;
    }
    if (c->collectives) print_collectives(p, a, e, c->world, out);
    if (c->sends || c->recvs) print_p2p(p, a, e, out);
    if (c->copies) print_copies(p, a, e, out);
    print_totals(c, out);
}

void comm_report(const Plan *p, FILE *out)
{
    const char *shard = plan_meta_str(p, "shard", "none");
    if (p->n_programs <= 1) {
        CommTotals c = comm_totals(p);
        if (c.world > 1)
            fprintf(out, "communication per step, each of ranks 0-%lld (strategy %s):\n", (long long)(c.world - 1), shard);
        else
            fprintf(out, "communication per step (rank 0 of 1, strategy %s):\n", shard);
        report_ops(p, 0, p->n_ops, &c, out);
        return;
    }
    for (int32_t k = 0; k < p->n_programs; k++) {
        const PlanProgram *g = &p->programs[k];
        CommTotals c = comm_totals_stage(p, k);
        char label[96];
        fprintf(out, "%scommunication per step, %s, each rank (strategy %s):\n", k ? "\n" : "",
                report_stage_label(p, k, label, sizeof label), shard);
        report_ops(p, g->first_op, g->first_op + g->n_ops, &c, out);
    }
}

double comm_op_bytes(const Plan *p, const PlanOp *op, int64_t dp_world)
{
    OpComm k = report_op_comm(p, op);
    if (k == COMM_NONE) return 0;
    if (is_copy(k)) return (double)plan_tensor_nbytes(&p->tensors[p->ids[op->in]]);
    if (is_p2p(k)) return (double)p2p_bytes(p, op, k);
    int64_t group = report_group_size(p, op, dp_world);
    return group > 1 ? factor_of(k) * (double)full_bytes(p, op) * (double)(group - 1) / (double)group : 0;
}
