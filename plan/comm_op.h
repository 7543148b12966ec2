/* plan/comm_op.h: the ops that communicate, as the plan layer knows them; private to
 * plan/ (check.c, p2p.c). A plan stores ops by name and this layer does not link the op
 * table, so these few are known here by their names in ops/ops.def: send and recv, the
 * pipeline's point-to-point ops (attribute `peer`: the other stage), and the collectives
 * (attribute `group`: 0, the default, the data-parallel ranks of the stage; 1, the
 * pipeline, one rank per stage; 2 and 3, hybrid sharding's shard group and replica
 * group), and offload's copies between the memory spaces, to_host
 * and to_device. Renaming them in ops.def changes the plan format.
 */
#ifndef FS_PLAN_COMM_OP_H
#define FS_PLAN_COMM_OP_H

#include "plan.h"

typedef enum { COMM_OP_NONE, COMM_OP_SEND, COMM_OP_RECV, COMM_OP_COLLECTIVE, COMM_OP_TO_HOST, COMM_OP_TO_DEVICE } CommOpKind;
enum { COMM_GROUP_DATA = 0, COMM_GROUP_PIPE = 1, COMM_GROUP_SHARD = 2, COMM_GROUP_REPLICA = 3 };  // as ops.h's

CommOpKind comm_op_kind(const Plan *p, const PlanOp *o);
/* The last attribute of o named key, or NULL. */
const PlanAttr *comm_op_attr(const Plan *p, const PlanOp *o, const char *key);
/* A collective's group (COMM_GROUP_DATA without the attribute); a send's or recv's peer
 * stage (PLAN_NONE without it). Both read an int attribute; plan_check vets them. */
int64_t comm_op_group(const Plan *p, const PlanOp *o);
int64_t comm_op_peer(const Plan *p, const PlanOp *o);
/* A send's or recv's tag (0 without the attribute): the k-th send from stage a to b with
 * tag t meets the k-th receive on b from a with tag t. */
int64_t comm_op_tag(const Plan *p, const PlanOp *o);

#endif
