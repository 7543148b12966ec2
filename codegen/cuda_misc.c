/* codegen/cuda_misc.c: the CUDA emitters of the constants (scalar, full, arange) and of
 * the collectives.
 *
 * Constants are written by a kernel like any other op (CPU: runtime/cpu/embed.c), their
 * values compiled in exactly: full's value is rounded to float, then to the output's
 * dtype once (st), as the CPU rounds it. Collectives have no instruction: the CUDA
 * backend runs all_reduce, reduce_scatter and all_gather on NCCL by the op's name, as the
 * CPU backend runs them on MPI.
 */
#include <math.h>

#include "cuda.h"

/* scalar(value): an f32 []. */
int cuda_scalar(CuCtx *c)
{
    char *src = cu_fmt(c, "extern \"C\" __global__ void KNAME(float *y) { y[0] = %s; }\n",
                       cu_float(c, (float)ir_attr_float(c->g, cu_node(c), "value", 0)));
    return cu_launch(c, "scalar", src, (CuDim){1, 1, 1}, (CuDim){1, 1, 1}, 0, (const int[]){cu_out_id(c, 0)}, 1);
}

/* full(value, shape): every element of the output, of any dtype, set to value. */
int cuda_full(CuCtx *c)
{
    const Value *y = cu_outv(c, 0);
    double value = ir_attr_float(c->g, cu_node(c), "value", 0);
    int64_t n = ir_numel(y);
    if (n == 0) return 0;
    char *set;
    if (y->dtype == DT_I32) {
        if (!(value >= INT32_MIN && value <= INT32_MAX)) return cu_fail(c, "value %g does not fit i32", value);
        set = cu_fmt(c, "y[i] = %d", (int)value);
    } else {
        set = cu_fmt(c, "st(y, i, %s)", cu_float(c, (float)value));
    }
    char *src = cu_fmt(c, "extern \"C\" __global__ void KNAME(%s *y)\n{\n    %s %s;\n}\n", cu_type(y->dtype),
                       cu_loop(c, cu_index(n), n), set);
    return cu_launch(c, "full", src, cu_grid(n), (CuDim){CU_BLOCK, 1, 1}, 0, (const int[]){cu_out_id(c, 0)}, 1);
}

/* arange(n): i32 0, 1, ..., n - 1. */
int cuda_arange(CuCtx *c)
{
    int64_t n = ir_numel(cu_outv(c, 0));
    if (n == 0) return 0;
    char *src = cu_fmt(c, "extern \"C\" __global__ void KNAME(int *y)\n{\n    %s y[i] = (int)i;\n}\n", cu_loop(c, cu_index(n), n));
    return cu_launch(c, "arange", src, cu_grid(n), (CuDim){CU_BLOCK, 1, 1}, 0, (const int[]){cu_out_id(c, 0)}, 1);
}

/* Run by the backend on NCCL: nothing to compile. */
int cuda_all_reduce(CuCtx *c) { return (void)c, 0; }
int cuda_reduce_scatter(CuCtx *c) { return (void)c, 0; }
int cuda_all_gather(CuCtx *c) { return (void)c, 0; }
int cuda_send(CuCtx *c) { return (void)c, 0; }
int cuda_recv(CuCtx *c) { return (void)c, 0; }
/* Copies between memory spaces are the backend's (a cudaMemcpyAsync on the copy stream). */
int cuda_to_host(CuCtx *c) { return (void)c, 0; }
int cuda_to_device(CuCtx *c) { return (void)c, 0; }
