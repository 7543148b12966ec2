/* report/comm.c: what a plan sends, per rank and step: every collective with its bytes.
 *
 * Bytes follow the ZeRO paper's accounting, per rank, for a buffer of Psi bytes (the
 * whole flat buffer, padding included): an all-reduce moves 2 Psi (a reduce-scatter then
 * an all-gather), a reduce-scatter Psi and an all-gather Psi. So DDP moves 2 Psi a step,
 * ZeRO-1 and ZeRO-2 2 Psi, and ZeRO-3 (fsdp) 3 Psi: 1.5 times DDP. The exact bytes a
 * ring sends are (world - 1) / world of these; both are listed.
 *
 * Which ops are collectives, and which, is the op table's to say (ops.def's comm column).
 */
#include "ops.h"
#include "report.h"

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
    case COMM_NONE:
    case COMM_COUNT: break;
    }
    return 0;
}

/* The collective op is, or COMM_NONE. */
static OpComm kind_of(const Plan *p, const PlanOp *op)
{
    return op->n_in < 1 || op->n_out < 1 ? COMM_NONE : op_comm_by_name(plan_str(p, op->op));
}

/* The full buffer: the larger of input and output (an all-reduce's are equal, a
 * reduce-scatter's input and an all-gather's output hold every rank's part). */
static int64_t full_bytes(const Plan *p, const PlanOp *op)
{
    int64_t in = plan_tensor_nbytes(&p->tensors[p->ids[op->in]]), out = plan_tensor_nbytes(&p->tensors[p->ids[op->out]]);
    return in > out ? in : out;
}

CommTotals comm_totals(const Plan *p)
{
    CommTotals c = {.world = plan_meta_int(p, "world", 1)};
    for (int32_t i = 0; i < p->n_ops; i++) {
        const PlanOp *op = &p->ops[i];
        OpComm k = kind_of(p, op);
        if (k == COMM_NONE) continue;
        double b = factor_of(k) * (double)full_bytes(p, op);
        c.collectives++;
        c.bytes += b;
        c.ring_bytes += c.world > 1 ? b * (double)(c.world - 1) / (double)c.world : 0;
    }
    return c;
}

static const char *what_of(const Plan *p, const PlanOp *op)
{
    int32_t t = p->ids[op->out];
    const char *name = plan_str(p, p->tensors[t].name);
    if (*name) return name;
    name = plan_str(p, p->tensors[p->ids[op->in]].name);
    return *name ? name : "";
}

void comm_report(const Plan *p, FILE *out)
{
    CommTotals c = comm_totals(p);
    if (c.world > 1)
        fprintf(out, "communication per step, each of ranks 0-%lld (strategy %s):\n", (long long)(c.world - 1),
                plan_meta_str(p, "shard", "none"));
    else
        fprintf(out, "communication per step (rank 0 of 1, strategy %s):\n", plan_meta_str(p, "shard", "none"));
    if (!c.collectives) {
        fprintf(out, "  none\n");
        return;
    }
    fprintf(out, "  %5s  %-14s %-28s %-10s %14s %14s\n", "op", "collective", "buffer", "phase", "bytes", "ring bytes");
    for (int32_t i = 0; i < p->n_ops; i++) {
        const PlanOp *op = &p->ops[i];
        OpComm k = kind_of(p, op);
        if (k == COMM_NONE) continue;
        double b = factor_of(k) * (double)full_bytes(p, op);
        double ring = c.world > 1 ? b * (double)(c.world - 1) / (double)c.world : 0;
        fprintf(out, "  %5d  %-14s %-28s %-10s %14.0f %14.0f\n", i, op_comm_name(k), what_of(p, op),
                plan_phase_name(op->phase), b, ring);
    }
    fprintf(out, "  total: %d collectives, %.0f bytes (%.2f MiB); a ring sends %.0f bytes\n", c.collectives, c.bytes,
            c.bytes / (1 << 20), c.ring_bytes);
}
