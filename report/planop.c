/* report/planop.c: what the reports read of a plan op beyond its fields: an integer
 * attribute, what it moves (the op table's comm column), and over how many ranks a
 * collective runs. The plan passed plan_check: ids and ranges are in bounds, values
 * are not trusted (a `group` of 7 is the data-parallel group, as the op table's default).
 */
#include <math.h>
#include <string.h>

#include "report.h"

int64_t report_op_int(const Plan *p, const PlanOp *op, const char *key, int64_t def)
{
    for (int32_t i = 0; i < op->n_attr; i++) {
        const PlanAttr *a = &p->attrs[op->attr + i];
        if (strcmp(plan_str(p, a->key), key)) continue;
        if (a->kind == PLAN_ATTR_INT) return a->i;
        if (a->kind == PLAN_ATTR_FLOAT && isfinite(a->f) && fabs(a->f) < 0x1p62) return (int64_t)llround(a->f);
        return def;
    }
    return def;
}

OpComm report_op_comm(const Plan *p, const PlanOp *op)
{
    OpComm k = op_comm_by_name(plan_str(p, op->op));
    switch (k) {
    case COMM_ALL_REDUCE:
    case COMM_REDUCE_SCATTER:
    case COMM_ALL_GATHER: return op->n_in >= 1 && op->n_out >= 1 ? k : COMM_NONE;
    case COMM_SEND: return op->n_in >= 1 ? k : COMM_NONE;
    case COMM_RECV: return op->n_out >= 1 ? k : COMM_NONE;
    case COMM_TO_HOST:
    case COMM_TO_DEVICE: return op->n_in >= 1 && op->n_out >= 1 ? k : COMM_NONE;
    case COMM_NONE:
    case COMM_COUNT: break;
    }
    return COMM_NONE;
}

int64_t report_group_size(const Plan *p, const PlanOp *op, int64_t dp_world)
{
    int64_t g = report_op_int(p, op, "group", OP_GROUP_DATA);
    if (g == OP_GROUP_SHARD || g == OP_GROUP_REPLICA) return report_op_int(p, op, "world", dp_world);  // hybrid's S, D/S
    return g == OP_GROUP_PIPE ? p->n_programs : dp_world;
}
