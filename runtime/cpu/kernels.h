/* runtime/cpu/kernels.h: the CPU backend's kernels, one per op of ir/ops.def.
 *
 * A kernel is a pure function of its call: it reads the input tensors and attributes
 * and writes its outputs (or, for OPF_EFFECT ops such as adamw, updates the inputs the
 * op's comment names). It allocates nothing: buffers are carved from the rank's arena
 * by the executor, and any per-thread scratch a kernel needs is small and on the stack.
 * Kernels use OpenMP for parallel loops and OpenBLAS (cblas_sgemm) for GEMMs.
 *
 * Storage is f32 for floats and int32 for indices in this version (KT_F16 / KT_BF16
 * storage arrives with the precision pass).
 *
 * Attributes are passed by position in the op's signature string (ir/ops.def): for
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
} KCall;

typedef void (*CpuKernel)(const KCall *k);

/* runtime/cpu/cast.c: 16-bit floats, rounded to nearest even (PyTorch's .half(),
 * .bfloat16()). */
uint16_t cpu_f32_to_f16(float f);
float cpu_f16_to_f32(uint16_t h);
uint16_t cpu_f32_to_bf16(float f);
float cpu_bf16_to_f32(uint16_t h);

/* The kernel of each op, by the op's index in ir/ops.def; never NULL. */
#define OP(name, n_out, flags, sig, grad) void cpu_##name(const KCall *k);
#include "ops.def"
#undef OP

/* runtime/cpu/table.c */
extern const CpuKernel cpu_kernels[];  // by op index in ops.def
extern const int cpu_kernel_count;
CpuKernel cpu_kernel_by_name(const char *name);  // NULL for an unknown name
#endif
