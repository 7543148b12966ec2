/* codegen/cuda_pending.c: TEMPORARY stubs for the emitters being written elsewhere
 * (reductions, norms, the loss, attention, embedding, rope), so the tree links until
 * they land; each fails, so codegen_cuda names the op it cannot emit yet. Delete this
 * file when the real emitters arrive (codegen/cuda_reduce.c, cuda_norm.c, cuda_loss.c,
 * cuda_attention.c, cuda_embed.c), and set CUDA_PROGRAM in codegen/plan_build.c to 1.
 */
#include "cuda.h"

#define PENDING(name) \
    int cuda_##name(CuCtx *c) { return cu_fail(c, "not yet"); }
PENDING(sum)
PENDING(mean)
PENDING(max)
PENDING(max_bwd)
PENDING(sum_to)
PENDING(softmax)
PENDING(softmax_bwd)
PENDING(layernorm)
PENDING(layernorm_bwd)
PENDING(rmsnorm)
PENDING(rmsnorm_bwd)
PENDING(cross_entropy)
PENDING(cross_entropy_bwd)
PENDING(sumsq)
PENDING(embedding)
PENDING(embedding_bwd)
PENDING(rope)
PENDING(attention)
PENDING(attention_bwd)
