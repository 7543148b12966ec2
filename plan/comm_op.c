/* plan/comm_op.c: which ops communicate, and their peer and group (see comm_op.h); the
 * shard group a plan's sharded views are split over, and which ops compute in the host
 * space (plan.h). */
#include <string.h>

#include "comm_op.h"

CommOpKind comm_op_kind(const Plan *p, const PlanOp *o)
{
    const char *name = plan_str(p, o->op);
    if (!strcmp(name, "send")) return COMM_OP_SEND;
    if (!strcmp(name, "recv")) return COMM_OP_RECV;
    if (!strcmp(name, "to_host")) return COMM_OP_TO_HOST;
    if (!strcmp(name, "to_device")) return COMM_OP_TO_DEVICE;
    if (!strcmp(name, "all_reduce") || !strcmp(name, "reduce_scatter") || !strcmp(name, "all_gather"))
        return COMM_OP_COLLECTIVE;
    return COMM_OP_NONE;
}

const PlanAttr *comm_op_attr(const Plan *p, const PlanOp *o, const char *key)
{
    for (int32_t i = o->n_attr - 1; i >= 0; i--)
        if (!strcmp(plan_str(p, p->attrs[o->attr + i].key), key)) return &p->attrs[o->attr + i];
    return NULL;
}

static int64_t attr_int(const Plan *p, const PlanOp *o, const char *key, int64_t def)
{
    const PlanAttr *a = comm_op_attr(p, o, key);
    return a && a->kind == PLAN_ATTR_INT ? a->i : def;
}

int64_t comm_op_group(const Plan *p, const PlanOp *o) { return attr_int(p, o, "group", COMM_GROUP_DATA); }
int64_t comm_op_peer(const Plan *p, const PlanOp *o) { return attr_int(p, o, "peer", PLAN_NONE); }
int64_t comm_op_tag(const Plan *p, const PlanOp *o) { return attr_int(p, o, "tag", 0); }

int64_t plan_shard_group(const Plan *p, int64_t dp_world)
{
    int64_t s = plan_meta_int(p, "shard_group", 0);
    return s > 0 && dp_world > 0 && dp_world % s == 0 ? s : dp_world;
}

int plan_op_on_host(const Plan *p, int32_t k)
{
    const PlanOp *o = &p->ops[k];
    CommOpKind kind = comm_op_kind(p, o);
    if (o->n_in + o->n_out == 0 || kind == COMM_OP_TO_HOST || kind == COMM_OP_TO_DEVICE) return 0;
    return p->tensors[p->ids[o->n_in ? o->in : o->out]].place == PLAN_PLACE_HOST;
}
