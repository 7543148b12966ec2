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
 * (same ids) with its schedule and memory plan, the blocks, the outputs, the step roles,
 * as meta the model's name, the compiler's version, the parameter count and every
 * training setting; and when memplan ran, the program (each space's arena) and the CUDA
 * program (codegen/cuda.h: instructions, the module section CUMD and meta
 * "cuda_workspace_bytes"). Free with plan_free. NULL with a message in err when out of
 * memory or when an op has no CUDA emitter for its case ("the CUDA program: op 12
 * (softmax): ..."). */
Plan *codegen_plan(const Graph *g, const TrainConfig *t, char *err, size_t errlen);
/* The same plan without the CUDA program (no instructions, no module, no workspace
 * meta): for reports of memory, communication and time (fsc --fit compiles many such). */
Plan *codegen_plan_report(const Graph *g, const TrainConfig *t, char *err, size_t errlen);

#endif
