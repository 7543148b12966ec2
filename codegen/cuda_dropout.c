/* codegen/cuda_dropout.c: the CUDA launch of dropout(x, rng; p, key, batch, mb, mbs): one
 * grid-stride kernel, codegen/kernels/dropout.cuh's template instantiated with the element
 * count, the op's key, the keep threshold of p (ops/philox.h: fs_dropout_threshold), the
 * micro-batch's place in the global batch and the scale 1 / (1 - p), rounded to float
 * once and compiled in exactly. runtime/cpu/dropout.c is the reference.
 *
 * Where it sits: called by codegen_cuda (cuda_program.c) through the op table.
 */
#include "cuda.h"
#include "philox.h"

int cuda_dropout(CuCtx *c)
{
    const Node *nd = cu_node(c);
    const Value *x = cu_inv(c, 0);
    int64_t n = ir_numel(x);
    if (n == 0) return 0;
    if (cu_inv(c, 1)->dtype != DT_I32) return cu_fail(c, "the rng input must be i32");
    double p = ir_attr_float(c->g, nd, "p", 0);
    if (!(p >= 0 && p < 1)) return cu_fail(c, "p = %g is outside [0, 1)", p);
    int64_t key = ir_attr_int(c->g, nd, "key", 0), batch = ir_attr_int(c->g, nd, "batch", 0);
    int64_t mb = ir_attr_int(c->g, nd, "mb", 0), mbs = ir_attr_int(c->g, nd, "mbs", 1);
    cu_use(c, "dropout.cuh");
    // no __restrict__: y may be x's bytes. mb and mbs only count with batch (else 0, so
    // that equal kernels stay one).
    const char *src = cu_kernel(
        c, 0, cu_fmt(c, "const %s *x, const int *rng, %s *y", cu_tin(c, 0), cu_tout(c, 0)),
        cu_fmt(c, "fs_dropout<%s, %lldLL, %uu, %lluull, %s, %lldLL, %lldLL>(x, rng, y, %s)", cu_index(n), (long long)n,
               (unsigned)key, fs_dropout_threshold(p), batch ? "true" : "false", (long long)(batch ? mbs : 0),
               (long long)(batch ? mb : 0), cu_float(c, (float)(1.0 / (1.0 - p)))));
    return cu_launch(c, "dropout", src, cu_grid(n), (CuDim){CU_BLOCK, 1, 1}, 0,
                     (const int[]){cu_in_id(c, 0), cu_in_id(c, 1), cu_out_id(c, 0)}, 3);
}
