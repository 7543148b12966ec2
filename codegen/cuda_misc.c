/* codegen/cuda_misc.c: the CUDA emitters of the constants (scalar, full, arange) and of
 * the collectives.
 *
 * Constants are written by a kernel like any other op (CPU: runtime/cpu/embed.c), one of
 * codegen/kernels/fill.cuh's templates, their values compiled in exactly: full's value is
 * rounded to float, then to the output's dtype once (st), as the CPU rounds it.
 * Collectives have no instruction: the CUDA backend runs all_reduce, reduce_scatter and
 * all_gather on NCCL by the op's name, as the CPU backend runs them on MPI.
 */
#include <math.h>

#include "cuda.h"

/* scalar(value): an f32 []. */
int cuda_scalar(CuCtx *c)
{
    cu_use(c, "fill.cuh");
    float v = (float)ir_attr_float(c->g, cu_node(c), "value", 0);
    char *src = cu_kernel(c, 0, "float *__restrict__ y", cu_fmt(c, "fs_scalar(y, %s)", cu_float(c, v)));
    return cu_launch(c, "scalar", src, (CuDim){1, 1, 1}, (CuDim){1, 1, 1}, 0, (const int[]){cu_out_id(c, 0)}, 1);
}

/* A grid-stride kernel over the n elements of the output: fill.cuh's template `tmpl`
 * instantiated for the index type and n, called with `args`. */
static int fill(CuCtx *c, const char *prefix, int64_t n, const char *tmpl, const char *args)
{
    cu_use(c, "fill.cuh");
    char *call = cu_fmt(c, "%s<%s, %lldLL>%s", tmpl, cu_index(n), (long long)n, args);
    char *src = cu_kernel(c, 0, cu_pout(c, 0, "y"), call);
    return cu_launch(c, prefix, src, cu_grid(n), (CuDim){CU_BLOCK, 1, 1}, 0, (const int[]){cu_out_id(c, 0)}, 1);
}

/* full(value, shape): every element of the output, of any dtype, set to value. */
int cuda_full(CuCtx *c)
{
    const Value *y = cu_outv(c, 0);
    double value = ir_attr_float(c->g, cu_node(c), "value", 0);
    int64_t n = ir_numel(y);
    if (n == 0) return 0;
    char *v;
    if (y->dtype == DT_I32) {
        if (!(value >= INT32_MIN && value <= INT32_MAX)) return cu_fail(c, "value %g does not fit i32", value);
        v = cu_fmt(c, "%d", (int)value);
    } else {
        v = cu_float(c, (float)value);
    }
    return fill(c, "full", n, "fs_full", cu_fmt(c, "(y, %s)", v));
}

/* buffer: no kernel; the producers of the values inside it write its bytes. */
int cuda_buffer(CuCtx *c) { return (void)c, 0; }

/* arange(n): i32 0, 1, ..., n - 1. */
int cuda_arange(CuCtx *c)
{
    int64_t n = ir_numel(cu_outv(c, 0));
    if (n == 0) return 0;
    return fill(c, "arange", n, "fs_arange", "(y)");
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
