/* runtime/cpu/table.c: the CPU kernel of every op, indexed like ir/ops.def, a lookup
 * by op name for code that knows ops only by the names a plan file stores, and the
 * workspace needs of the few kernels whose 16-bit calls use one. */
#include <string.h>

#include "cpu_impl.h"

const CpuKernel cpu_kernels[] = {
#define OP(name, n_out, flags, sig, grad) cpu_##name,
#include "ops.def"
#undef OP
};

static const char *const names[] = {
#define OP(name, n_out, flags, sig, grad) #name,
#include "ops.def"
#undef OP
};

const int cpu_kernel_count = (int)(sizeof cpu_kernels / sizeof *cpu_kernels);

CpuKernel cpu_kernel_by_name(const char *name)
{
    for (int i = 0; i < cpu_kernel_count; i++)
        if (!strcmp(names[i], name)) return cpu_kernels[i];
    return NULL;
}

static const struct {
    CpuKernel fn;
    CpuWork (*need)(const KCall *k);
} needs[] = {
    {cpu_matmul, cpu_work_matmul},
    {cpu_softmax, cpu_work_softmax},
    {cpu_softmax_bwd, cpu_work_softmax_bwd},
    {cpu_max, cpu_work_max},
    {cpu_max_bwd, cpu_work_max_bwd},
    {cpu_layernorm, cpu_work_layernorm},
    {cpu_rmsnorm, cpu_work_rmsnorm},
    {cpu_layernorm_bwd, cpu_work_norm_bwd},
    {cpu_rmsnorm_bwd, cpu_work_norm_bwd},
    {cpu_cross_entropy, cpu_work_cross_entropy},
    {cpu_cross_entropy_bwd, cpu_work_cross_entropy},
    {cpu_embedding_bwd, cpu_work_embedding_bwd},
    {cpu_attention, cpu_work_attention},
    {cpu_attention_bwd, cpu_work_attention_bwd},
    {cpu_rope, cpu_work_rope},
};

CpuWork cpu_work(CpuKernel fn, const KCall *k)
{
    for (size_t i = 0; i < sizeof needs / sizeof *needs; i++)
        if (needs[i].fn == fn) return needs[i].need(k);
    return (CpuWork){0, 0};
}
