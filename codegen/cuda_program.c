/* codegen/cuda_program.c: the CUDA program of a graph (codegen/cuda.h).
 *
 * Walks the nodes in order and calls each op's emitter through a table generated from
 * ir/ops.def (as runtime/cpu/table.c does for the CPU kernels), so adding an op adds its
 * emitter here without a line of this file. A fused group (passes/fuse.c: Node.group)
 * is emitted once, at its last node, as one kernel (cu_group); its other members get no
 * instruction. The instructions go into the plan sorted by op, the module's text into
 * meta "cuda_source", and the cuBLAS workspace the runtime allocates besides the arena
 * into meta "cuda_workspace_bytes" (reported on its own line, never in the arena).
 */
#include <stdio.h>

#include "cuda.h"

enum { CUDA_WORKSPACE_BYTES = 32 << 20 };  // cuBLAS's recommended workspace on Hopper

static int (*const EMITTERS[])(CuCtx *c) = {
#define OP(name, n_out, flags, sig, grad) cuda_##name,
#include "ops.def"
#undef OP
};
_Static_assert(sizeof EMITTERS / sizeof *EMITTERS == OP_COUNT, "one emitter per op");

/* Whether node n is a member of a fused group that goes on after it. */
static int group_continues(const Graph *g, int n)
{
    return g->nodes[n].group >= 0 && n + 1 < g->n_nodes && g->nodes[n + 1].group == g->nodes[n].group;
}

int codegen_cuda(const Graph *g, Plan *p, char *err, size_t errlen)
{
    CuCtx c = {.g = g, .m = cu_module_new(g->arena, p), .err = err, .errlen = errlen};
    for (int n = 0; n < g->n_nodes; n++) {
        if (group_continues(g, n)) continue;  // its group's last node emits it
        c.node = n;
        int group = g->nodes[n].group;
        if (group >= 0 ? cu_group(&c, group) : EMITTERS[g->nodes[n].op](&c)) return -1;
    }
    if (plan_meta_set_str(p, "cuda_source", cu_module_text(c.m)) ||
        plan_meta_set_int(p, "cuda_workspace_bytes", CUDA_WORKSPACE_BYTES)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

const char *codegen_cuda_source(const Plan *p) { return plan_meta_str(p, "cuda_source", NULL); }
