/* runtime/cpu/table.c: the CPU kernel of every op, indexed like ir/ops.def, and a lookup
 * by op name for code that knows ops only by the names a plan file stores. */
#include <string.h>

#include "kernels.h"

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
