/* tests/unit/test_kernels.c: report/kernels.c, what each CUDA instruction of a plan should
 * cost, on tiny GPT-2 in bf16: a GEMM's FLOPs and bytes from m, n, k and its dtypes; which
 * arguments a kernel reads and writes, from its parameters (adamw's in-place p, m, v;
 * layernorm's backward reading its partials from dx's bytes in its second kernel and
 * writing dx in its third); attention on tensor cores (its "_tc_" kernels take the op's
 * FLOPs at the tensor-core rate), as attention (pack_attention 0) and as attention_qkv, which
 * reads q, k, v from one tensor and writes one dqkv; a fused group's FLOPs; the roofline at the GPU's rates; the
 * sums by kind; and the fallback to the op's outputs when a kernel's parameters cannot
 * be read.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "report.h"
#include "sample.h"

static const KernGpu GPU = {"test", 1e15, 5e13, 2e12, 4e14};

static Plan *tiny_with(Graph **g, const char *fuse_gemm)
{
    const Setting set[] = {{"precision", "bf16"}, {"fuse_gemm", fuse_gemm}};
    return sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, set, 2, g);
}

static Plan *tiny(Graph **g) { return tiny_with(g, "1"); }

static double nbytes(const Plan *p, int32_t id) { return (double)plan_tensor_nbytes(&p->tensors[id]); }

static int32_t arg(const Plan *p, const KernLaunch *l, int a) { return p->ids[p->cuda[l->index].args + a]; }

/* The n-th launch (0-based) of kind op, or NULL. */
static const KernLaunch *nth(const KernReport *r, const char *op, int n)
{
    for (int32_t j = 0; j < r->n_launch; j++)
        if (!strcmp(plan_str(r->plan, r->plan->ops[r->launch[j].op].op), op) && n-- == 0) return &r->launch[j];
    return NULL;
}

Test(kernels, gemm)
{
    Plan *p = tiny(NULL);
    char err[256];
    KernReport *r = report_kernels_new(p, 0, &GPU, err, sizeof err);
    cr_assert(r, "%s", err);
    const KernLaunch *l = nth(r, "matmul", 0);
    cr_assert(l);
    const PlanCuda *in = &p->cuda[l->index];
    double m = (double)in->m, n = (double)in->n, k = (double)in->k, b = (double)in->batch;
    cr_assert_eq(l->flops, 2 * m * n * k * b);
    cr_assert(l->tensor_core, "a bf16 GEMM runs on tensor cores");
    cr_assert_eq(l->bytes_written, m * n * b * 2);
    cr_assert_eq(l->bytes_read, (m * k * (in->stride_a ? b : 1) + k * n * (in->stride_b ? b : 1)) * 2);
    double want = l->flops / GPU.flops_16bit, mem = (l->bytes_read + l->bytes_written) / GPU.hbm_bw;
    cr_assert_float_eq(l->seconds, want > mem ? want : mem, 1e-18);
    report_kernels_free(r);
    plan_free(p);
}

Test(kernels, reads_and_writes_from_the_parameters)
{
    Plan *p = tiny(NULL);
    char err[256];
    KernReport *r = report_kernels_new(p, 0, &GPU, err, sizeof err);
    cr_assert(r, "%s", err);
    /* adamw_cast(p, g, m, v, lr, coef, step, w): every argument but w read, p, m and v
     * written back, w (the 16-bit params) written only */
    const KernLaunch *a = nth(r, "adamw_cast", 0);
    cr_assert(a);
    double all = 0;
    for (int i = 0; i < 7; i++) all += nbytes(p, arg(p, a, i));
    cr_assert_eq(a->bytes_read, all);
    cr_assert_eq(a->bytes_written, nbytes(p, arg(p, a, 0)) + nbytes(p, arg(p, a, 2)) + nbytes(p, arg(p, a, 3)) +
                                       nbytes(p, arg(p, a, 7)));
    cr_assert_eq(nbytes(p, arg(p, a, 7)) * 2, nbytes(p, arg(p, a, 0)), "w is bf16 p");
    cr_assert(!a->tensor_core);
    /* layernorm_bwd's kernels: partials into dx's bytes (x, dy read; dx written), the
     * finish (dx read; dw, db written), dx (x, w, dy read; dx written) */
    const KernLaunch *k1 = nth(r, "layernorm_bwd", 0), *k2 = nth(r, "layernorm_bwd", 1);
    const KernLaunch *k3 = nth(r, "layernorm_bwd", 2);
    cr_assert(k1 && k2 && k3 && k1->op == k2->op && k2->op == k3->op, "three kernels of one op");
    cr_assert_eq(k1->bytes_read, nbytes(p, arg(p, k1, 0)) + nbytes(p, arg(p, k1, 1)));
    cr_assert_eq(k1->bytes_written, nbytes(p, arg(p, k1, 2)));
    cr_assert_eq(k2->bytes_read, nbytes(p, arg(p, k2, 0)));
    cr_assert_eq(k2->bytes_written, nbytes(p, arg(p, k2, 1)) + nbytes(p, arg(p, k2, 2)));
    cr_assert_eq(k3->bytes_written, nbytes(p, arg(p, k3, 3)));
    /* the op's FLOPs split over its three kernels by the bytes each moves */
    double f = k1->flops + k2->flops + k3->flops, b1 = k1->bytes_read + k1->bytes_written;
    double b = b1 + k2->bytes_read + k2->bytes_written + k3->bytes_read + k3->bytes_written;
    cr_assert_float_eq(f, p->ops[k1->op].flops, 1e-6 * f);
    cr_assert_float_eq(k1->flops, f * b1 / b, 1e-6 * f);
    report_kernels_free(r);
    plan_free(p);
}

static void attention_on_tensor_cores(int packed)
{
    const Setting set[] = {{"precision", "bf16"}, {"pack_attention", packed ? "1" : "0"}};
    Plan *p = sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, set, 2, NULL);
    const char *fwd = packed ? "attention_qkv" : "attention", *bwd = packed ? "attention_qkv_bwd" : "attention_bwd";
    char err[256];
    KernReport *r = report_kernels_new(p, 0, &GPU, err, sizeof err);
    cr_assert(r, "%s", err);
    const KernLaunch *f = nth(r, fwd, 0);
    cr_assert(f && strstr(plan_str(p, p->cuda[f->index].kernel), "_tc_"), "bf16 attention, head dim 16: flash.cuh");
    cr_assert(f->tensor_core);
    cr_assert_float_eq(f->flops, p->ops[f->op].flops, 1e-6 * f->flops);
    double tc = f->flops / GPU.flops_16bit, mem = (f->bytes_read + f->bytes_written) / GPU.hbm_bw;
    cr_assert_float_eq(f->seconds, tc > mem ? tc : mem, 1e-18, "priced at the tensor-core rate");
    /* the backward: Dr (no FLOPs, not on tensor cores), then dK/dV and dQ sharing the op's FLOPs */
    const KernLaunch *d = nth(r, bwd, 0), *kv = nth(r, bwd, 1), *q = nth(r, bwd, 2);
    cr_assert(d && kv && q && d->op == kv->op && kv->op == q->op, "three kernels of one op");
    cr_assert(!d->tensor_core && kv->tensor_core && q->tensor_core);
    cr_assert_eq(d->flops, 0);
    cr_assert_float_eq(kv->flops + q->flops, p->ops[d->op].flops, 1e-6 * kv->flops);
    /* dK/dV reads Dr from dq's bytes (its 6th parameter, const), and writes dk and dv only; packed, dq, dk and dv
     * are one parameter, dqkv (its 4th, after qkv, lse and dout), which the report counts as written whole */
    if (packed)
        cr_assert_eq(kv->bytes_written, nbytes(p, arg(p, kv, 3)));
    else
        cr_assert_eq(kv->bytes_written, nbytes(p, arg(p, kv, 6)) + nbytes(p, arg(p, kv, 7)));
    cr_assert_eq(d->bytes_written, nbytes(p, arg(p, d, 2)));
    report_kernels_free(r);
    plan_free(p);
}

Test(kernels, attention_on_tensor_cores) { attention_on_tensor_cores(0); }
Test(kernels, packed_attention_on_tensor_cores) { attention_on_tensor_cores(1); }

/* fp32 under the tf32 setting: attention's "_tc_" kernels and every f32 GEMM at the TF32 rate; without it
 * attention runs on the f32 kernels and the GEMMs on the FMA units. */
Test(kernels, tf32_priced_at_the_tf32_rate)
{
    for (int tf32 = 0; tf32 < 2; tf32++) {
        const Setting set[] = {{"tf32", tf32 ? "1" : "0"}};
        Plan *p = sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, set, 1, NULL);
        char err[256];
        KernReport *r = report_kernels_new(p, 0, &GPU, err, sizeof err);
        cr_assert(r, "%s", err);
        int attention = 0, gemms = 0;
        for (int32_t j = 0; j < r->n_launch; j++) {
            const KernLaunch *l = &r->launch[j];
            int gemm = p->cuda[l->index].kind == PLAN_CU_GEMM;
            int tc_kernel = !gemm && strstr(plan_str(p, p->cuda[l->index].kernel), "_tc_") != NULL;
            attention += tc_kernel, gemms += gemm;
            cr_assert_eq(l->tf32, tf32 && (gemm || tc_kernel), "launch %d", j);
            cr_assert_eq(l->tensor_core, l->tf32, "launch %d: fp32 reaches tensor cores only as TF32", j);
            double rate = l->tf32 ? GPU.flops_tf32 : GPU.flops_fp32;
            double c = l->flops / rate, mem = (l->bytes_read + l->bytes_written) / GPU.hbm_bw;
            cr_assert_float_eq(l->seconds, c > mem ? c : mem, 1e-18, "launch %d", j);
        }
        cr_assert_eq(attention, tf32 ? 2 * 3 : 0, "tf32: the forward and two backward kernels a layer, 2 layers");
        cr_assert_gt(gemms, 0);
        report_kernels_free(r);
        plan_free(p);
    }
}

/* A GEMM with an epilogue (passes/epilogue.c): its op's FLOPs (the product and the GELU),
 * and its bytes: the bias read, C and the GELU's input written. */
Test(kernels, epilogue_gemm)
{
    Plan *p = tiny(NULL);
    char err[256];
    KernReport *r = report_kernels_new(p, 0, &GPU, err, sizeof err);
    cr_assert(r, "%s", err);
    const KernLaunch *l = nth(r, "matmul_bias_gelu", 0);
    cr_assert(l, "a matmul_bias_gelu GEMM");
    const PlanCuda *in = &p->cuda[l->index];
    cr_assert_eq(in->epilogue, PLAN_EPI_GELU_AUX_BIAS);
    double product = 2.0 * (double)(in->m * in->n * in->k);
    cr_assert_float_eq(l->flops, p->ops[l->op].flops, 1e-9 * l->flops);
    cr_assert_gt(l->flops, product);
    cr_assert_float_eq(l->bytes_written, nbytes(p, arg(p, l, 2)) + nbytes(p, arg(p, l, 4)), 1e-9);
    cr_assert_float_eq(l->bytes_read, nbytes(p, arg(p, l, 0)) + nbytes(p, arg(p, l, 1)) + nbytes(p, arg(p, l, 3)), 1e-9);
    report_kernels_free(r);
    plan_free(p);
}

/* Fused elementwise groups: the plan without the GEMM epilogues, which leave GPT-2 no chains. */
Test(kernels, fused_groups_and_sums)
{
    Graph *g;
    Plan *p = tiny_with(&g, "0");
    char err[256];
    KernReport *r = report_kernels_new(p, 0, &GPU, err, sizeof err);
    cr_assert(r, "%s", err);
    double all = 0;  // every device op's FLOPs: each op's are some instruction's
    for (int32_t k = 0; k < p->n_ops; k++)
        if (!plan_op_on_host(p, k)) all += p->ops[k].flops;
    cr_assert_float_eq(r->flops, all, 1e-9 * all, "%g FLOPs in the launches, %g in the ops", r->flops, all);
    int fused = 0;
    for (int32_t j = 0; j < r->n_launch; j++) {
        const KernLaunch *l = &r->launch[j];
        int32_t op = l->op;
        fused |= g->nodes[op].group >= 0 && g->nodes[op].group < op && l->flops > p->ops[op].flops;
    }
    cr_assert(fused, "a fused group's launch does its members' FLOPs too");
    double s = 0, t = 0;
    int n = 0;
    for (int32_t k = 0; k < r->n_kind; k++) {
        s += r->kind[k].seconds, n += r->kind[k].instructions;
        if (k) cr_assert(r->kind[k - 1].seconds >= r->kind[k].seconds, "the longest kind first");
    }
    for (int32_t j = 0; j < r->n_launch; j++) t += r->launch[j].seconds;
    cr_assert_float_eq(s, r->seconds, 1e-12);
    cr_assert_float_eq(t, r->seconds, 1e-12);
    cr_assert_eq(n, p->n_cuda);
    cr_assert_eq(r->n_launches + r->n_gemms, p->n_cuda);
    report_kernels_free(r);
    ir_graph_free(g);
    plan_free(p);
}

Test(kernels, fallback_without_the_parameters)
{
    Plan *p = tiny(NULL);
    char err[256];
    KernReport *r = report_kernels_new(p, 0, &GPU, err, sizeof err);
    cr_assert(r, "%s", err);
    const KernLaunch *k2 = nth(r, "layernorm_bwd", 1);
    double written = k2->bytes_written, read = k2->bytes_read;
    report_kernels_free(r);
    plan_set_cuda_module(p, "// no kernels here");
    r = report_kernels_new(p, 0, &GPU, err, sizeof err);
    cr_assert(r, "%s", err);
    k2 = nth(r, "layernorm_bwd", 1);
    /* by the op: dx, dw, db are its outputs, so all three count as written */
    cr_assert_eq(k2->bytes_written, written + read);
    cr_assert_eq(k2->bytes_read, 0);
    report_kernels_free(r);
    plan_free(p);
}

Test(kernels, no_cuda_program)
{
    Plan *p = plan_new();
    char err[256];
    cr_assert_null(report_kernels_new(p, 0, &GPU, err, sizeof err));
    cr_assert(strstr(err, "no CUDA program"), "%s", err);
    plan_free(p);
}
