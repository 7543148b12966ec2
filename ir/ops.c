/* ir/ops.c: the IR's hooks of every op, generated from ops/ops.def: the FLOP count
 * (flops_NAME, ir/flops.c) and the gradient rule (grad_GRAD, ir/grad.c). They need the
 * graph, so they live here and not in the op layer's table (ops/ops.c), which holds
 * everything else and is what the runtime reads. */
#include "ir.h"

static const IrOpHooks hooks[OP_COUNT] = {
#define OP(name, n_out, flags, sig, rule, ...) {.flops = flops_##name, .grad = grad_##rule},
#include "ops.def"
#undef OP
};

const IrOpHooks *ir_op_hooks(OpKind op)
{
    FS_ASSERT((unsigned)op < OP_COUNT);
    return &hooks[op];
}
