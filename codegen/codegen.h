/* codegen/codegen.h: the last stage of fsc. It turns the final IR graph (after every
 * pass) and the training settings into a Plan (plan/plan.h), which fsc writes with
 * plan_write and fsexec runs. Grouped by the file that defines each declaration.
 */
#ifndef FS_CODEGEN_H
#define FS_CODEGEN_H

#include "ir.h"
#include "plan.h"

/* ---- codegen/plan_build.c: Graph -> Plan ------------------------------------------ */

/* The plan of graph g trained with t: every value as a tensor and every node as an op
 * (same ids) with its memory plan, the blocks, the outputs, and as meta the model's
 * name, the compiler's version, the parameter count, the arena size ("arena_bytes",
 * left out when memplan did not run) and every training setting; and when memplan ran,
 * the CUDA program (codegen/cuda.h: instructions, meta "cuda_source" and
 * "cuda_workspace_bytes"). Free with plan_free. NULL with a message in err when out of
 * memory or when an op has no CUDA emitter for its case ("the CUDA program: op 12
 * (softmax): ..."). */
Plan *codegen_plan(const Graph *g, const TrainConfig *t, char *err, size_t errlen);

#endif
