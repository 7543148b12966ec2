/* tests/cuda_emu/test_cuda_emu.c: the cuda-emu backend itself (tests/cuda_emu/backend.c
 * and emu.hpp), on small hand-made plans: a test backend that passed broken kernels
 * would make every cuda_emu_* test worthless, so each kind of fault it claims to catch
 * is made here on purpose and must be caught: a race between barriers, a write past a
 * tensor's end or before its start, a read of shared memory no thread wrote, an index
 * past a __shared__ array, a misaligned vector load, __syncthreads after some threads
 * returned, a warp shuffle with exited lanes, __trap, overlapping __restrict__
 * arguments, a kernel whose parameters do not match its launch, and GEMMs that cuBLAS
 * would refuse. And what works must work: thread and block indices of 3-D launches,
 * warp shuffles and ballots, block-wide reductions of the real prelude's kind, and
 * cuBLAS's column-major GEMM against a plain triple loop, with transposes, batches and
 * offsets.
 *
 * The library is loaded with dlopen from FS_CUDAEMU_LIB, as op_check loads it; its
 * compiled kernels go to a cache directory of this build.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_plans.h"

TestSuite(cuda_emu, .init = emu_plans_load);

/* ---- what works ------------------------------------------------------------------------ */

Test(cuda_emu, indices_shuffles_ballots_and_block_sums)
{
    static const char src[] =
        "#include <cuda_fp16.h>\n"
        "__device__ float bsum(float v, int t, int n)\n"
        "{\n"
        "    __shared__ float part[32];\n"
        "    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
        "    __syncthreads();\n"
        "    if ((t & 31) == 0) part[t >> 5] = v;\n"
        "    __syncthreads();\n"
        "    v = (t & 31) < (n >> 5) ? part[t & 31] : 0.0f;\n"
        "    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
        "    return v;\n"
        "}\n"
        "extern \"C\" __global__ void where(const float *__restrict__ x, float *__restrict__ y)\n"
        "{\n"
        "    const int t = threadIdx.y * blockDim.x + threadIdx.x, b = blockIdx.y * gridDim.x + blockIdx.x;\n"
        "    const int i = b * blockDim.x * blockDim.y + t;\n"
        "    const unsigned odd = __ballot_sync(0xffffffffu, threadIdx.x & 1);\n"
        "    const float from = __shfl_sync(0xffffffffu, x[i], 3);\n"
        "    y[i] = bsum(x[i], t, blockDim.x * blockDim.y) + 1000.0f * (odd == 0xaaaaaaaau) + 10000.0f * from + (float)min(i, 5LL);\n"
        "}\n";
    T *t = t_new(src);
    int n = 2 * 3 * 64 * 2;  // grid 2 x 3, blocks 64 x 2
    int32_t x = tensor(t, PLAN_DT_F32, n), y = tensor(t, PLAN_DT_F32, n);
    for (int i = 0; i < n; i++) t_f32(t, x)[i] = (float)(i % 7);
    launch(t, "where", 2, 3, 64, 2, (int32_t[]){x, y}, 2);
    cr_assert_eq(t_run(t), 0, "%s", t->err);
    for (int i = 0; i < n; i++) {
        float sum = 0;
        for (int j = i / 128 * 128; j < i / 128 * 128 + 128; j++) sum += (float)(j % 7);
        float want = sum + 1000.0f + 10000.0f * (float)((i / 32 * 32 + 3) % 7) + (float)(i < 5 ? i : 5);
        cr_expect_float_eq(t_f32(t, y)[i], want, 1e-6, "element %d: %g, want %g", i, t_f32(t, y)[i], want);
    }
    t_free(t);
}

/* The plain definition of cuBLAS's column-major GEMM, in double. */
static void ref_gemm(const PlanCuda *g, const float *A, const float *B, float *C)
{
    /* Row-major as the plan states it (plan/plan.h): C_b = op(A_b) @ op(B_b). */
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t i = 0; i < g->m; i++)
            for (int64_t j = 0; j < g->n; j++) {
                double s = 0;
                for (int64_t l = 0; l < g->k; l++) {
                    const float *a = A + g->a_off + b * g->stride_a, *bb = B + g->b_off + b * g->stride_b;
                    s += (double)(g->ta ? a[l * g->lda + i] : a[i * g->lda + l]) * (g->tb ? bb[j * g->ldb + l] : bb[l * g->ldb + j]);
                }
                C[g->c_off + b * g->stride_c + i * g->ldc + j] = (float)s;
            }
}

Test(cuda_emu, gemm_as_cublas_runs_it)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            PlanCuda g = {.ta = ta, .tb = tb, .m = 5, .n = 7, .k = 3, .batch = 2, .a_off = 2, .b_off = 1, .c_off = 3};
            g.lda = (ta ? g.m : g.k) + 1, g.ldb = (tb ? g.k : g.n) + 2, g.ldc = g.n + 1;
            g.stride_a = (ta ? g.k : g.m) * g.lda, g.stride_b = tb ? 0 : (g.k * g.ldb), g.stride_c = g.m * g.ldc;
            T *t = t_new("");
            int32_t A = tensor(t, PLAN_DT_F32, 2 + 2 * g.stride_a), B = tensor(t, PLAN_DT_F32, 1 + 2 * g.k * g.ldb + 40),
                    C = tensor(t, PLAN_DT_F32, 3 + 2 * g.stride_c);
            float want[200] = {0};
            for (int i = 0; i < 2 + 2 * g.stride_a; i++) t_f32(t, A)[i] = (float)((i * 7) % 11) - 5;
            for (int i = 0; i < 1 + 2 * g.k * g.ldb + 40; i++) t_f32(t, B)[i] = (float)((i * 5) % 13) - 6;
            ref_gemm(&g, t_f32(t, A), t_f32(t, B), want);
            gemm(t, A, B, C, &g);
            cr_assert_eq(t_run(t), 0, "%s", t->err);
            for (int64_t b = 0; b < 2; b++)
                for (int64_t i = 0; i < g.m; i++)
                    for (int64_t j = 0; j < g.n; j++) {
                        int64_t at = g.c_off + b * g.stride_c + i * g.ldc + j;
                        cr_expect_float_eq(t_f32(t, C)[at], want[at], 1e-6, "ta %d tb %d: C[%lld][%lld][%lld]", ta, tb,
                                           (long long)b, (long long)i, (long long)j);
                    }
            t_free(t);
        }
}

Test(cuda_emu, gemm_cublas_refuses)
{
    static const struct {
        PlanDType a, b;
        int lda;
        const char *want;
    } cases[] = {
        {PLAN_DT_F32, PLAN_DT_F32, 2, "CUBLAS_STATUS_INVALID_VALUE"},     // lda < k
        {PLAN_DT_BF16, PLAN_DT_F32, 4, "CUBLAS_STATUS_NOT_SUPPORTED"},    // mixed operands
        {PLAN_DT_F32, PLAN_DT_F32, 40, "outside its tensor"},             // A past its end
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        T *t = t_new("");
        PlanCuda g = {.m = 4, .n = 4, .k = 4, .lda = cases[k].lda, .ldb = 4, .ldc = 4, .batch = 1};
        int32_t A = tensor(t, cases[k].a, 16), B = tensor(t, cases[k].b, 16), C = tensor(t, PLAN_DT_F32, 16);
        gemm(t, A, B, C, &g);
        cr_expect_neq(t_run(t), 0, "case %zu ran", k);
        cr_expect(strstr(t->err, cases[k].want), "case %zu: %s", k, t->err);
        t_free(t);
    }
}

/* ---- what must be caught ----------------------------------------------------------------- */

Test(cuda_emu, race_between_barriers)
{
    /* Each thread reads its neighbour's shared slot without a __syncthreads between. */
    expect_error("extern \"C\" __global__ void racy(const float *x, float *y)\n"
                 "{\n"
                 "    __shared__ float s[64];\n"
                 "    s[threadIdx.x] = x[threadIdx.x];\n"
                 "    y[threadIdx.x] = s[(threadIdx.x + 1) % 64];\n"
                 "}\n",
                 "racy", 64, 64, "in reverse order (a race)");
}

Test(cuda_emu, write_before_start)
{
    expect_error("extern \"C\" __global__ void under(const float *x, float *y) { y[(int)threadIdx.x - 1] = x[threadIdx.x]; }\n",
                 "under", 32, 32, "before argument 1");
}

Test(cuda_emu, write_past_end, .signal = SIGSEGV)
{
    /* Far enough past the end to reach the guard page: the process dies, naming the kernel. */
    expect_error("extern \"C\" __global__ void over(const float *x, float *y) { y[threadIdx.x + 2048] = x[threadIdx.x]; }\n",
                 "over", 32, 32, "");
}

Test(cuda_emu, shared_memory_starts_undefined)
{
    static const char src[] = "extern \"C\" __global__ void unset(const float *x, float *y)\n"
                              "{\n"
                              "    __shared__ float s[32];\n"
                              "    if (threadIdx.x < 16) s[threadIdx.x] = x[threadIdx.x];\n"
                              "    __syncthreads();\n"
                              "    y[threadIdx.x] = s[threadIdx.x];\n"
                              "}\n";
    T *t = t_new(src);
    int32_t x = tensor(t, PLAN_DT_F32, 32), y = tensor(t, PLAN_DT_F32, 32);
    launch(t, "unset", 1, 1, 32, 1, (int32_t[]){x, y}, 2);
    cr_assert_eq(t_run(t), 0, "%s", t->err);
    cr_expect(t_f32(t, y)[3] == 0.0f && isnan(t_f32(t, y)[20]), "%g %g", t_f32(t, y)[3], t_f32(t, y)[20]);
    t_free(t);
}

Test(cuda_emu, shared_array_index_past_its_end, .signal = SIGABRT)
{
    expect_error("extern \"C\" __global__ void sidx(const float *x, float *y)\n"
                 "{\n"
                 "    __shared__ float s[32];\n"
                 "    s[threadIdx.x + 1] = x[threadIdx.x];\n"
                 "    __syncthreads();\n"
                 "    y[threadIdx.x] = s[threadIdx.x];\n"
                 "}\n",
                 "sidx", 32, 32, "");
}

Test(cuda_emu, misaligned_vector_load, .signal = SIGABRT)
{
    expect_error("extern \"C\" __global__ void mis(const float *x, float *y)\n"
                 "{\n"
                 "    const float4 v = *reinterpret_cast<const float4 *>(x + 1 + 4 * threadIdx.x);\n"
                 "    y[threadIdx.x] = v.x + v.w;\n"
                 "}\n",
                 "mis", 32, 256, "");
}

Test(cuda_emu, syncthreads_after_some_returned)
{
    expect_error("extern \"C\" __global__ void early(const float *x, float *y)\n"
                 "{\n"
                 "    if (threadIdx.x >= 32) return;\n"
                 "    __syncthreads();\n"
                 "    y[threadIdx.x] = x[threadIdx.x];\n"
                 "}\n",
                 "early", 64, 64, "__syncthreads in block 0,0,0 after 32 of its 64 threads exited");
}

Test(cuda_emu, shuffle_with_exited_lanes)
{
    expect_error("extern \"C\" __global__ void lanes(const float *x, float *y)\n"
                 "{\n"
                 "    if (threadIdx.x >= 16) return;\n"
                 "    y[threadIdx.x] = __shfl_xor_sync(0xffffffffu, x[threadIdx.x], 1);\n"
                 "}\n",
                 "lanes", 32, 32, "after 16 of its lanes exited");
}

Test(cuda_emu, trap)
{
    expect_error("extern \"C\" __global__ void trapper(const float *x, float *y) { if (threadIdx.x == 5) __trap(); }\n",
                 "trapper", 32, 32, "__trap() (block 0,0,0, thread 5,0,0)");
}

Test(cuda_emu, parameters_do_not_match_the_launch)
{
    expect_error("extern \"C\" __global__ void three(const float *x, float *y, float *z) { }\n", "three", 32, 32,
                 "does not take exactly 2 pointers");
}

Test(cuda_emu, overlapping_restrict_arguments)
{
    T *t = t_new("extern \"C\" __global__ void alias(const float *__restrict__ x, float *__restrict__ y)\n"
                 "{ y[threadIdx.x] = x[threadIdx.x + 1]; }\n");
    int32_t x = tensor(t, PLAN_DT_F32, 64), y = view(t, x, 16, 32);
    launch(t, "alias", 1, 1, 32, 1, (int32_t[]){x, y}, 2);
    cr_expect_neq(t_run(t), 0);
    cr_expect(strstr(t->err, "__restrict__ (undefined on a GPU)"), "%s", t->err);
    t_free(t);
}
