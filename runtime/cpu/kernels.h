/* runtime/cpu/kernels.h: the CPU backend's kernels, one per op of ops/ops.def.
 *
 * A kernel is a pure function of its call: it reads the input tensors and attributes
 * and writes its outputs (or, for OPF_EFFECT ops such as adamw, updates the inputs the
 * op's comment names). It allocates nothing: buffers are carved from the rank's arena
 * by the executor, and any per-thread scratch a kernel needs is small and on the stack
 * (or, for 16-bit calls, in the workspace below).
 * Kernels use OpenMP for parallel loops and OpenBLAS (cblas_sgemm) for GEMMs.
 *
 * Floats are stored as f32, f16 or bf16, indices as int32. Every kernel reads 16-bit
 * elements as f32, computes in f32 (sums, statistics, softmax, the loss and GEMM
 * accumulation included) and rounds each output to its dtype to nearest even, once:
 * a 16-bit call gives the f32 kernel's result on the same values, rounded. Outputs
 * take the dtype the shape rule gives (ops/shape.c); the few mixed calls are the ones
 * shape rules allow (cast; cross_entropy's f32 loss; attention's f32 lse; f32 dloss).
 * The optimizer ops (adamw, sgd, clip_coef, ...) take f32 only.
 *
 * Some 16-bit calls need f32 room beyond the stack (matmul converts panels of its
 * operands for cblas_sgemm): the WORKSPACE, one buffer per executor passed to every
 * call in work / work_floats (the CPU analogue of cuBLAS's workspace). cpu_work says
 * how much a call needs; a kernel blocks its work to fit whatever it is given, and the
 * blocking never changes the result with the thread count. f32 calls never touch it.
 *
 * Attributes are passed by position in the op's signature string (ops/ops.def): for
 * "x, axis:int=-1, keepdim:flag=0", attr[1] is axis and attr[2] keepdim (attr[0], the
 * tensor, is unused). Ints and flags arrive as doubles holding exact integers. An
 * ATTR_INTS attribute (reshape's shape, permute's dims) arrives in ints/n_ints.
 */
#ifndef FS_CPU_KERNELS_H
#define FS_CPU_KERNELS_H

#include <stdint.h>

enum { KT_F32, KT_F16, KT_BF16, KT_I32 };
#define K_MAX_RANK 6
#define K_MAX_TENSORS 16
#define K_MAX_ATTRS 16

typedef struct {
    void *data;
    int dtype;  // KT_*
    int rank;
    int64_t shape[K_MAX_RANK];
    int64_t numel;
} KTensor;

typedef struct {
    KTensor in[K_MAX_TENSORS];
    int n_in;
    KTensor out[K_MAX_TENSORS];
    int n_out;
    double attr[K_MAX_ATTRS];
    const int64_t *ints;
    int n_ints;
    float *work;        // the executor's workspace, shared by every call (NULL: none)
    size_t work_floats;
} KCall;

typedef void (*CpuKernel)(const KCall *k);

/* Workspace floats a call needs: at least `least` (one unit of its work: a row, a
 * slab, a panel), and `all` to do everything in one piece; both 0 for calls that need
 * none (every f32 call, and 16-bit elementwise and layout calls). */
typedef struct {
    size_t least, all;
} CpuWork;

/* runtime/cpu/cast.c: 16-bit floats, rounded to nearest even (PyTorch's .half(),
 * .bfloat16()). */
uint16_t cpu_f32_to_f16(float f);
float cpu_f16_to_f32(uint16_t h);
uint16_t cpu_f32_to_bf16(float f);
float cpu_bf16_to_f32(uint16_t h);

/* The kernel of each op, by the op's index in ops/ops.def; never NULL. */
#define OP(name, ...) void cpu_##name(const KCall *k);
#include "ops.def"
#undef OP

/* Several calls as one parallel region, bit for bit what the calls give one by one.
 * runtime/cpu/group.c: a fused group of elementwise calls (one output each, of one
 * shape), chunk by chunk over its first `split` dims; cpu_group_split gives the most
 * dims it can cut (0: none). The caller keeps every member's inputs apart from the
 * members' outputs (memplan does so for a fused group). */
int cpu_group_split(const KCall *const *k, int n);
void cpu_group_run(const CpuKernel *fn, const KCall *const *k, int n, int split);
/* runtime/cpu/optim.c: adamw calls on disjoint buffers; first: n + 1 int64 of room. */
void cpu_adamw_many(const KCall *const *k, int n, int64_t *first);

/* runtime/cpu/table.c */
extern const CpuKernel cpu_kernels[];  // by op index in ops.def
extern const int cpu_kernel_count;
CpuKernel cpu_kernel_by_name(const char *name);  // NULL for an unknown name
CpuWork cpu_work(CpuKernel fn, const KCall *k);
#endif
