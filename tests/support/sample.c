/* tests/support/sample.c: see sample.h. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "sample.h"

const Define SAMPLE_GPT2[6] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 256}, {"B", 4}};
const Define SAMPLE_LLAMA[7] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"F", 176}, {"T", 32}, {"V", 256}, {"B", 4}};

const char *sample_source(const char *file)
{
    char path[512];
    snprintf(path, sizeof path, "%s/samples/%s", FS_SOURCE_DIR, file);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    static char src[1 << 16];
    size_t len = fread(src, 1, sizeof src - 1, f);
    fclose(f);
    src[len] = 0;
    return src;
}

const char *sample_source_with(const char *file, const char *before, const char *text)
{
    static char src[1 << 16];
    snprintf(src, sizeof src, "%s", sample_source(file));
    char *at = strstr(src, before);
    size_t n = strlen(text);
    cr_assert(at && strlen(src) + n < sizeof src, "samples/%s: no \"%s\" to insert before", file, before);
    memmove(at + n, at, strlen(at) + 1);
    memcpy(at, text, n);
    return src;
}

Plan *sample_compile(const char *file, const Define *defs, int n_defs, const Setting *set, int n_set, Graph **out)
{
    return sample_compile_source(file, sample_source(file), defs, n_defs, set, n_set, out);
}

Plan *sample_compile_source(const char *file, const char *src, const Define *defs, int n_defs, const Setting *set,
                            int n_set, Graph **out)
{
    size_t len = strlen(src);
    Diag d;
    diag_init(&d, file, src, len, stderr);
    FrontendOptions fo = {defs, n_defs, set, n_set};
    Options o = {0};
    Graph *g = fe_compile(src, len, &fo, &o.train, &d);
    cr_assert_not_null(g, "%s does not compile", file);
    cr_assert_eq(passes_run(g, &o, &d), 0, "%s: a pass failed", file);
    char err[512];
    Plan *p = codegen_plan(g, &o.train, err, sizeof err);
    cr_assert_not_null(p, "%s: %s", file, err);
    if (out)
        *out = g;
    else
        ir_graph_free(g);
    return p;
}

/* Tensor t as f32 into out (room for t.numel). */
static void as_f32(const RtTensor *t, float *out)
{
    const uint16_t *h = t->data;
    for (int64_t j = 0; j < t->numel; j++)
        out[j] = t->dtype == PLAN_DT_F32 ? ((const float *)t->data)[j]
                 : t->dtype == PLAN_DT_BF16 ? cpu_bf16_to_f32(h[j]) : cpu_f16_to_f32(h[j]);
}

Exec *sample_exec_with(const Plan *p, const ExecOptions *eo, RtData **data)
{
    char err[256];
    Exec *e = rt_exec_new(p, eo, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    *data = rt_data_open(e, NULL, RT_ORDER_SEQUENTIAL, eo->seed, err, sizeof err);
    cr_assert_not_null(*data, "%s", err);
    return e;
}

Exec *sample_exec(const Plan *p, uint64_t seed, RtData **data)
{
    return sample_exec_with(p, &(ExecOptions){.seed = seed}, data);
}

float *sample_step1_grads(const Plan *p, size_t *n)
{
    RtData *data;
    Exec *e = sample_exec(p, 5, &data);
    rt_data_fill(data, 1);
    /* Everything up to the update: forward, recompute, backward and the collectives. */
    cr_assert_eq(rt_exec_run_ops(e, 1, 0, rt_exec_first_op(e, PLAN_PHASE_OPTIMIZER), RT_PHASES_ALL), 0);
    size_t total = 0;
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].role == PLAN_ROLE_PARAM && p->tensors[i].grad != PLAN_NONE)
            total += (size_t)plan_tensor_numel(&p->tensors[p->tensors[i].grad]);
    float *out = malloc(sizeof(float) * total + 1);
    size_t k = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        if (p->tensors[i].role != PLAN_ROLE_PARAM || p->tensors[i].grad == PLAN_NONE) continue;
        RtTensor t;
        rt_exec_tensor_id(e, p->tensors[i].grad, &t);
        cr_assert(t.dtype != PLAN_DT_I32, "gradient %s is %s", t.name, plan_dtype_name(t.dtype));
        as_f32(&t, out + k);  // a 16-bit gradient the update reads as it is
        k += (size_t)t.numel;
    }
    *n = k;
    rt_data_close(data);
    rt_exec_free(e);
    return out;
}

Exec *sample_train_with(const Plan *p, const ExecOptions *eo, int steps, float *loss)
{
    RtData *d;
    Exec *e = sample_exec_with(p, eo, &d);
    for (int s = 1; s <= steps; s++) {
        rt_data_fill(d, s);
        cr_assert_eq(rt_exec_run(e, s, RT_PHASES_ALL), 0);
        RtTensor t;
        rt_exec_tensor_id(e, p->outputs[0], &t);
        loss[s - 1] = *(float *)t.data;
    }
    rt_data_close(d);
    return e;
}

Exec *sample_train(const Plan *p, uint64_t seed, int steps, float *loss)
{
    return sample_train_with(p, &(ExecOptions){.seed = seed}, steps, loss);
}

void sample_losses(const Plan *p, uint64_t seed, int steps, float *loss)
{
    rt_exec_free(sample_train(p, seed, steps, loss));
}

/* The weights the step keeps: f32 params and masters in buffers of their own (a 16-bit
 * compute copy, or an fsdp param's view of its gathered unit, lies in bytes the step
 * reuses). */
static int is_weight(const PlanTensor *t)
{
    return (t->role == PLAN_ROLE_PARAM || t->role == PLAN_ROLE_MASTER) && t->dtype == PLAN_DT_F32 && t->alias == PLAN_NONE;
}

float *sample_trained(const Plan *p, uint64_t seed, int steps, float *loss, size_t *n)
{
    Exec *e = sample_train(p, seed, steps, loss);
    size_t total = 0, k = 0;
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (is_weight(&p->tensors[i])) total += (size_t)plan_tensor_numel(&p->tensors[i]);
    float *params = malloc(sizeof(float) * total + 1);
    for (int32_t i = 0; i < p->n_tensors; i++) {
        if (!is_weight(&p->tensors[i])) continue;
        RtTensor t;
        rt_exec_tensor_id(e, i, &t);
        as_f32(&t, params + k);
        k += (size_t)t.numel;
    }
    *n = k;
    rt_exec_free(e);
    return params;
}
