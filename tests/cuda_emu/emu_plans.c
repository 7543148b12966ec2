/* tests/cuda_emu/emu_plans.c: small hand-made plans run through the cuda-emu backend, for
 * its Criterion tests (test_cuda_emu.c, test_tc.c): tensors laid out back to back,
 * 64-byte aligned, launches of kernels given as CUDA source, GEMMs; the backend loaded
 * with dlopen from FS_CUDAEMU_LIB as op_check loads it, its compiled kernels in a cache
 * directory of this build.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_plans.h"

const RtBackendOps *ops;

void emu_plans_load(void)
{
    setenv("FS_CUDA_EMU_CACHE", FS_BINARY_DIR "/cuda_emu/cache", 1);
    void *so = dlopen(FS_CUDAEMU_LIB, RTLD_NOW | RTLD_LOCAL);
    cr_assert(so, "%s", dlerror());
    RtBackendEntry entry;
    *(void **)&entry = dlsym(so, RT_BACKEND_SYMBOL);
    cr_assert(entry);
    ops = entry();
    cr_assert_eq(ops->abi, RT_BACKEND_ABI);
    cr_assert_str_eq(ops->name, "cuda-emu");
}

T *t_new(const char *source)
{
    T *t = calloc(1, sizeof *t);
    t->p = plan_new();
    cr_assert(t->p);
    plan_set_cuda_module(t->p, source);
    return t;
}

int32_t tensor(T *t, PlanDType dt, int64_t numel)
{
    PlanTensor x = {.name = PLAN_NONE, .dtype = dt, .role = PLAN_ROLE_ACT, .rank = 1, .shape = {numel},
                    .block = PLAN_NONE, .producer = PLAN_NONE, .tied_to = PLAN_NONE, .grad = PLAN_NONE,
                    .offset = t->top, .alias = PLAN_NONE, .unit = PLAN_NONE};
    t->top += (numel * plan_dtype_size(dt) + 63) / 64 * 64;
    return plan_tensor_add(t->p, &x);
}

/* A view: numel elements of root from element `at`. */
int32_t view(T *t, int32_t root, int64_t at, int64_t numel)
{
    PlanTensor x = t->p->tensors[root];
    x.offset += at * plan_dtype_size(x.dtype), x.shape[0] = numel, x.alias = root;
    return plan_tensor_add(t->p, &x);
}

int32_t op(T *t, const char *name)
{
    PlanOp o = {.op = plan_intern(t->p, name), .block = PLAN_NONE, .in = t->p->n_ids, .out = t->p->n_ids,
                .attr = t->p->n_attrs};
    return plan_op_add(t->p, &o);
}

int32_t launch(T *t, const char *kernel, int gx, int gy, int bx, int by, const int32_t *args, int n)
{
    PlanCuda c = {.op = op(t, kernel), .kind = PLAN_CU_LAUNCH, .kernel = plan_intern(t->p, kernel),
                  .args = t->p->n_ids, .n_args = n, .grid = {gx, gy, 1}, .block = {bx, by, 1}};
    for (int i = 0; i < n; i++) plan_id_add(t->p, args[i]);
    int32_t at = plan_cuda_add(t->p, &c);
    cr_assert_geq(at, 0);
    return at;
}

void gemm(T *t, int32_t A, int32_t B, int32_t C, const PlanCuda *shape)
{
    PlanCuda c = *shape;
    c.op = op(t, "matmul"), c.kind = PLAN_CU_GEMM, c.kernel = PLAN_NONE, c.args = t->p->n_ids, c.n_args = 3;
    plan_id_add(t->p, A), plan_id_add(t->p, B), plan_id_add(t->p, C);
    cr_assert_geq(plan_cuda_add(t->p, &c), 0);
}

/* The host arena (inputs set through t_f32), then the backend made from it. */
float *t_f32(T *t, int32_t id)
{
    if (!t->host) {
        plan_set_one_program(t->p, 1, t->top, 0);
        t->host = calloc(1, (size_t)t->top + 1);
    }
    return (float *)((char *)t->host + t->p->tensors[id].offset);
}

/* Makes the backend and runs every op: 0, or -1 with the message in t->err. */
int t_run(T *t)
{
    t_f32(t, 0);
    RtBackendOptions o = {.plan = t->p, .host_arena = t->host, .host_bytes = t->top, .rank = 0, .world = 1,
                          .local_rank = -1};
    t->b = ops->create(&o, t->err, sizeof t->err);
    if (!t->b) return -1;
    int rc = ops->run_ops(t->b, 0, t->p->n_ops);
    if (rc) snprintf(t->err, sizeof t->err, "%s", ops->error(t->b));
    for (int32_t i = 0; !rc && i < t->p->n_tensors; i++)
        if (t->p->tensors[i].alias == PLAN_NONE) ops->download(t->b, i, t_f32(t, i));
    return rc;
}

void t_free(T *t)
{
    if (t->b) ops->destroy(t->b);
    plan_free(t->p);
    free(t->host);
    free(t);
}

void expect_error(const char *source, const char *kernel, int bx, int n, const char *want)
{
    T *t = t_new(source);
    int32_t x = tensor(t, PLAN_DT_F32, n), y = tensor(t, PLAN_DT_F32, n);
    for (int i = 0; i < n; i++) t_f32(t, x)[i] = (float)i;
    launch(t, kernel, 1, 1, bx, 1, (int32_t[]){x, y}, 2);
    cr_expect_neq(t_run(t), 0, "%s: no error", kernel);
    cr_expect(strstr(t->err, want), "%s: the message does not say \"%s\": %s", kernel, want, t->err);
    t_free(t);
}

