/* codegen/cuda_program.c: the CUDA program of a graph (codegen/cuda.h).
 *
 * Walks the nodes in order and calls each op's emitter through a table generated from
 * ops/ops.def (as runtime/cpu/table.c does for the CPU kernels), so adding an op adds its
 * emitter here without a line of this file. A fused group (passes/fuse.c: Node.group)
 * is emitted once, at its last node, as one kernel (cu_group); its other members get no
 * instruction, nor does a node of the host space (offload's, which the host runs). The instructions go into the plan sorted by op, the module's text into
 * the plan's CUDA module (section CUMD), and the cuBLAS workspace the runtime allocates besides the arena
 * into meta "cuda_workspace_bytes" (reported on its own line, never in the arena).
 */
#include <inttypes.h>
#include <stdio.h>

#include "cuda.h"

enum { CUDA_WORKSPACE_BYTES = 32 << 20 };  // cuBLAS's recommended workspace on Hopper

static int (*const EMITTERS[])(CuCtx *c) = {
#define OP(name, ...) cuda_##name,
#include "ops.def"
#undef OP
};
_Static_assert(sizeof EMITTERS / sizeof *EMITTERS == OP_COUNT, "one emitter per op");

/* Whether node n computes in the host space (offload's update and casts): the host runs
 * it, so it has no CUDA instruction. */
static int on_host(const Graph *g, int n)
{
    const Node *node = ir_node(g, n);
    if (node->n_in + node->n_out == 0) return 0;
    return ir_value(g, node->n_out ? ir_out(g, node, 0) : ir_in(g, node, 0))->place == PLACE_HOST;
}

int codegen_cuda(const Graph *g, Plan *p, char *err, size_t errlen)
{
    CuCtx c = {.g = g, .m = cu_module_new(g->arena, p), .err = err, .errlen = errlen,
               .tf32 = plan_meta_int(p, "tf32", 0) != 0};  // plan_build.c records the settings first
    for (int n = 0; n < g->n_nodes; n++) {
        if (ir_group_last(g, n) != n || on_host(g, n)) continue;  // its group's last node emits it; the host runs it
        c.node = n;
        int group = g->nodes[n].group;
        if (group >= 0 ? cu_group(&c, group) : EMITTERS[g->nodes[n].op](&c)) return -1;
    }
    if (plan_set_cuda_module(p, cu_module_text(c.m)) ||
        plan_meta_set_int(p, "cuda_workspace_bytes", CUDA_WORKSPACE_BYTES)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

const char *codegen_cuda_source(const Plan *p) { return p->cuda_module; }

static void print_args(const Plan *p, const PlanCuda *in, FILE *out)
{
    for (int32_t k = 0; k < in->n_args; k++) fprintf(out, "%s%%%d", k ? "," : " args ", p->ids[in->args + k]);
}

int codegen_cuda_print(const Plan *p, FILE *out)
{
    fprintf(out, "# The CUDA program of model %s (plan/plan.h: PlanCuda), one instruction a line:\n"
                 "#   OP NAME LINE LAUNCH kernel grid X,Y,Z block X,Y,Z smem BYTES args %%TENSORS\n"
                 "#   OP NAME LINE GEMM m n k ta tb lda ldb ldc batch stride_a,b,c off_a,b,c args %%A,%%B,%%C\n"
                 "# Kernels are in kernels.cu; ops without a line run no CUDA work of their own\n"
                 "# (views, collectives on NCCL, members of a fused group but the last).\n",
            plan_meta_str(p, "model", "?"));
    for (int32_t i = 0; i < p->n_cuda; i++) {
        const PlanCuda *in = &p->cuda[i];
        const PlanOp *op = &p->ops[in->op];
        fprintf(out, "%d %s %d ", in->op, plan_str(p, op->op), op->line);
        if (in->kind == PLAN_CU_LAUNCH)
            fprintf(out, "LAUNCH %s grid %d,%d,%d block %d,%d,%d smem %d", plan_str(p, in->kernel), in->grid[0], in->grid[1],
                    in->grid[2], in->block[0], in->block[1], in->block[2], in->smem);
        else
            fprintf(out,
                    "GEMM m %" PRId64 " n %" PRId64 " k %" PRId64 " ta %d tb %d lda %" PRId64 " ldb %" PRId64 " ldc %" PRId64
                    " batch %" PRId64 " stride %" PRId64 ",%" PRId64 ",%" PRId64 " off %" PRId64 ",%" PRId64 ",%" PRId64,
                    in->m, in->n, in->k, in->ta, in->tb, in->lda, in->ldb, in->ldc, in->batch, in->stride_a, in->stride_b,
                    in->stride_c, in->a_off, in->b_off, in->c_off);
        if (in->kind == PLAN_CU_GEMM && in->epilogue) fprintf(out, " epilogue %s", plan_epilogue_name(in->epilogue));
        if (in->kind == PLAN_CU_GEMM && in->beta) fprintf(out, " beta 1");
        print_args(p, in, out);
        fputc('\n', out);
    }
    return ferror(out) ? -1 : 0;
}
