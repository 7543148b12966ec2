/* codegen/cuda.h: CUDA C for every op of the final graph, the CUDA program of a plan.
 *
 * codegen_cuda walks the scheduled graph and, for each node (or fused group, see
 * passes/fuse.c: Node.group), calls the op's emitter `cuda_NAME` (declared from
 * ir/ops.def like every other hook). An emitter writes the CUDA C of its kernels into a
 * CuCtx and records, in order, the instructions that run them (PlanCuda in plan/plan.h):
 * LAUNCHes of its kernels, or GEMMs for cuBLAS. Everything static is compiled in:
 * shapes, strides, attributes, dtypes. A kernel's parameters are device pointers to the
 * tensors in its launch's args, nothing else, so the runtime binds every launch from the
 * plan alone and a step can be captured as a CUDA graph.
 *
 * Numerics are the CPU backend's (runtime/cpu/kernels.h): 16-bit elements are loaded
 * as f32, everything is computed in f32 (sums, statistics, softmax, loss, GEMM
 * accumulation), and each output is rounded to its dtype once, to nearest even.
 *
 * Kernel names are deterministic: PREFIX_HHHHHHHH, the hash of the kernel's text, so
 * equal kernels (the same op on the same shapes in every block) are emitted once and the
 * source of a plan depends only on the graph. The module's text (a fixed prelude, then
 * the kernels in first-use order) is the plan's meta "cuda_source"; `fsc --emit cuda
 * DIR` writes it and NVRTC compiles it for sm_80 and sm_90 in the test suite.
 */
#ifndef FS_CODEGEN_CUDA_H
#define FS_CODEGEN_CUDA_H

#include "ir.h"
#include "plan.h"

typedef struct CuModule CuModule;

/* The node being emitted, and where its text and instructions go. */
typedef struct {
    const Graph *g;
    int node;        // the node (a fused group: its last node)
    CuModule *m;
    char *err;       // cu_fail writes here
    size_t errlen;
} CuCtx;

typedef struct {
    int x, y, z;
} CuDim;

/* One cuBLAS call, row-major as PlanCuda's GEMM describes it. A, B, C are value ids. */
typedef struct {
    int A, B, C;
    int ta, tb;
    int64_t m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c, batch, a_off, b_off, c_off;
} CuGemm;

/* ---- codegen/cuda_module.c: the module being built --------------------------------- */

/* Adds a kernel and a LAUNCH of it for the current node. `src` is the whole kernel,
 * `extern "C" __global__ void KNAME(...) { ... }`, with the literal token KNAME where its
 * name goes; cu_launch names it PREFIX_HASH, adds it to the module once (by text), and
 * records the launch: grid x block threads, smem bytes of dynamic shared memory,
 * args: value ids passed as pointers in the kernel's parameter order. 0, or -1 (cu_fail). */
int cu_launch(CuCtx *c, const char *prefix, const char *src, CuDim grid, CuDim block, int smem, const int *args,
              int n_args);
/* Records a GEMM for the current node. */
int cu_gemm(CuCtx *c, const CuGemm *gm);
/* Formats a message into c->err and returns -1: "op 12 (softmax): ...". */
int cu_fail(CuCtx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* printf into a kernel's text, which lives in the module's arena (the graph's). */
char *cu_fmt(CuCtx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The CUDA type of a dtype: "float", "__half", "__nv_bfloat16", "int". */
const char *cu_type(DType t);

/* The prelude every module starts with (cuda_module.c) gives kernels, for each storage
 * type T in {float, __half, __nv_bfloat16, int}:
 *   float ld(const T *p, long long i);      // element i as f32 (int: converted)
 *   void  st(T *p, long long i, float v);   // v rounded to T to nearest even
 * and fs_warp_sum / fs_warp_max (f32 over a warp), fs_block_sum / fs_block_max (f32
 * over a block of up to 1024 threads, using 32 floats of static shared memory). */

/* ---- the emitters, one per op ----------------------------------------------------- */
#define OP(name, n_out, flags, sig, grad) int cuda_##name(CuCtx *c);
#include "ops.def"
#undef OP

/* ---- codegen/cuda_program.c ------------------------------------------------------- */

/* The CUDA program of g (after memplan) into p, which codegen_plan has filled from g
 * (same ids): p's cuda instructions and its meta "cuda_source". 0, or -1 with a message
 * (an op no emitter handles) in err. */
int codegen_cuda(const Graph *g, Plan *p, char *err, size_t errlen);
/* The CUDA source of a plan (meta "cuda_source"), or NULL. */
const char *codegen_cuda_source(const Plan *p);

#endif
