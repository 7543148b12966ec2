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
 * precision); tests/unit/test_zero_formulas.c holds these at scale. The exact bytes a
 * ring sends are (group - 1) / group of these; both are listed. A collective's group is
 * its stage's data-parallel ranks, or (group 1) the pipeline group: one rank per stage.
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
    CommTotals c = {.world = dp_world};
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
        c.collectives++;
        c.bytes += b;
        c.ring_bytes += group > 1 ? b * (double)(group - 1) / (double)group : 0;
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

static void print_collectives(const Plan *p, int32_t a, int32_t e, int64_t dp_world, FILE *out)
{
    fprintf(out, "  %5s  %-14s %-28s %-10s %14s %14s\n", "op", "collective", "buffer", "phase", "bytes", "ring bytes");
    for (int32_t i = a; i < e; i++) {
        const PlanOp *op = &p->ops[i];
        OpComm k = report_op_comm(p, op);
        if (k == COMM_NONE || is_p2p(k) || is_copy(k)) continue;
        int64_t group = report_group_size(p, op, dp_world);
        double b = factor_of(k) * (double)full_bytes(p, op);
        double ring = group > 1 ? b * (double)(group - 1) / (double)group : 0;
        fprintf(out, "  %5d  %-14s %-28s %-10s %14.0f %14.0f", i, op_comm_name(k), what_of(p, op),
                plan_phase_name(op->phase), b, ring);
        if (report_op_int(p, op, "group", OP_GROUP_DATA) == OP_GROUP_PIPE)
            fprintf(out, "  over the pipeline group (%lld ranks, one per stage)", (long long)group);
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
    fprintf(out, "    %-10s %7s %16s %9s %16s\n", "peer", "sends", "bytes", "receives", "bytes");
    for (int i = 0; i < n; i++) {
        char who[32];
        snprintf(who, sizeof who, "stage %lld", (long long)peers[i].peer);
        fprintf(out, "    %-10s %7d %16.0f %9d %16.0f\n", who, peers[i].sends, peers[i].send_bytes, peers[i].recvs,
                peers[i].recv_bytes);
    }
    if (more) fprintf(out, "    (%d more ops to peers not shown)\n", more);
}

/* The copies of ops [a, e) between the device and the host, one line each. */
static void print_copies(const Plan *p, int32_t a, int32_t e, FILE *out)
{
    fprintf(out, "  between device and host (offload), over the rank's own link:\n");
    fprintf(out, "  %5s  %-14s %-28s %-10s %14s\n", "op", "copy", "buffer", "phase", "bytes");
    for (int32_t i = a; i < e; i++) {
        const PlanOp *op = &p->ops[i];
        OpComm k = report_op_comm(p, op);
        if (!is_copy(k)) continue;
        fprintf(out, "  %5d  %-14s %-28s %-10s %14lld\n", i, op_comm_name(k), what_of(p, op), plan_phase_name(op->phase),
                (long long)plan_tensor_nbytes(&p->tensors[p->ids[op->in]]));
    }
}

static void print_totals(const CommTotals *c, FILE *out)
{
    if (c->collectives || !c->copies)
        fprintf(out, "  total: %d collectives, %.0f bytes (%.2f MiB); a ring sends %.0f bytes\n", c->collectives,
                c->bytes, c->bytes / (1 << 20), c->ring_bytes);
    if (c->sends || c->recvs)
        fprintf(out, "  point-to-point: %d sends, %.0f bytes (%.2f MiB); %d receives, %.0f bytes (%.2f MiB)\n", c->sends,
                c->send_bytes, c->send_bytes / (1 << 20), c->recvs, c->recv_bytes, c->recv_bytes / (1 << 20));
    if (c->copies)
        fprintf(out, "  device <-> host: %d copies, %.0f bytes to the host (%.2f MiB), %.0f bytes to the device (%.2f MiB)\n",
                c->copies, c->to_host_bytes, c->to_host_bytes / (1 << 20), c->to_device_bytes,
                c->to_device_bytes / (1 << 20));
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
