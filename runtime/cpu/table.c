/* runtime/cpu/table.c: the CPU kernel of every op, indexed like ops/ops.def, a lookup
 * by op name for code that knows ops only by the names a plan file stores, and the
 * workspace needs of the few kernels whose 16-bit calls use one. */
#include "cpu_impl.h"
#include "ops.h"

const CpuKernel cpu_kernels[] = {
#define OP(name, ...) cpu_##name,
#include "ops.def"
#undef OP
};

const int cpu_kernel_count = (int)(sizeof cpu_kernels / sizeof *cpu_kernels);
_Static_assert(sizeof cpu_kernels / sizeof *cpu_kernels == OP_COUNT, "one kernel per op");

CpuKernel cpu_kernel_by_name(const char *name)
{
    OpKind k = op_lookup(name);
    return k == OP_COUNT ? NULL : cpu_kernels[k];
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
    {cpu_cross_entropy_fused, cpu_work_cross_entropy},
    {cpu_embedding_bwd, cpu_work_embedding_bwd},
    {cpu_embedding_bwd_into, cpu_work_embedding_bwd},
    {cpu_attention, cpu_work_attention},
    {cpu_attention_bwd, cpu_work_attention_bwd},
    {cpu_attention_qkv, cpu_work_attention_qkv},
    {cpu_attention_qkv_bwd, cpu_work_attention_qkv_bwd},
    {cpu_rope, cpu_work_rope},
    {cpu_rope_at, cpu_work_rope_at},
    {cpu_attention_masked, cpu_work_attention_masked},
    {cpu_attention_masked_bwd, cpu_work_attention_masked_bwd},
    {cpu_attention_qkv_masked, cpu_work_attention_qkv_masked},
    {cpu_attention_qkv_masked_bwd, cpu_work_attention_qkv_masked_bwd},
    {cpu_matmul_bias, cpu_work_epilogue},
    {cpu_matmul_bias_gelu, cpu_work_epilogue},
    {cpu_matmul_dgelu_bgrad, cpu_work_epilogue},
    {cpu_matmul_bgrad, cpu_work_epilogue},
    {cpu_matmul_bias_add, cpu_work_epilogue},
    {cpu_matmul_add, cpu_work_epilogue},
    {cpu_layernorm_bwd_add, cpu_work_norm_bwd},
    {cpu_rmsnorm_bwd_add, cpu_work_norm_bwd},
    {cpu_rope_rows, cpu_work_rope_rows},
    {cpu_attention_rows, cpu_work_attention_rows},
    {cpu_attention_rows_bwd, cpu_work_attention_rows_bwd},
};

CpuWork cpu_work(CpuKernel fn, const KCall *k)
{
    for (size_t i = 0; i < sizeof needs / sizeof *needs; i++)
        if (needs[i].fn == fn) return needs[i].need(k);
    return (CpuWork){0, 0};
}
