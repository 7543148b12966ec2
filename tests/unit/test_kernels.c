/* tests/unit/test_kernels.c: report/kernels.c, what each CUDA instruction of a plan should
 * cost, on tiny GPT-2 in bf16: a GEMM's FLOPs and bytes from m, n, k and its dtypes; which
 * arguments a kernel reads and writes, from its parameters (adamw's in-place p, m, v;
 * layernorm's backward reading its partials from dx's bytes in its second kernel and
 * writing dx in its third); attention on tensor cores (its "_tc_" kernels take the op's
 * FLOPs at the tensor-core rate), as attention (pack_attention 0) and as attention_qkv, which
 * reads q, k, v from one tensor and writes one dqkv; a fused group's FLOPs; the roofline at the GPU's rates; the
 * sums by kind; the fallback to the op's outputs when a kernel's parameters cannot
 * be read; and which GEMMs are not 16-byte aligned, by which rule (mlp's 4-class head in
 * bf16, GPT-2 at C = 64 and 100, and each rule alone on a GEMM whose fields are changed).
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

/* ---- alignment: the GEMMs cuBLAS cannot run on its 16-byte tensor-core kernels ---------- */

#define BIT(rule) (1u << (rule))

/* mlp without vocabulary padding, which would widen its head, if passes/pad_vocab.c padded it. */
static Plan *mlp(const char *precision)
{
    const Setting set[] = {{"precision", precision}, {"pad_vocab", "0"}};
    return sample_compile("mlp.fsm", NULL, 0, set, 2, NULL);
}

/* The first GEMM of kind op whose m, n and k are these (-1: any), or NULL. */
static const KernLaunch *gemm(const KernReport *r, const char *op, int64_t m, int64_t n, int64_t k)
{
    for (int n_th = 0;; n_th++) {
        const KernLaunch *l = nth(r, op, n_th);
        if (!l) return NULL;
        const PlanCuda *in = &r->plan->cuda[l->index];
        if (in->kind == PLAN_CU_GEMM && (m < 0 || in->m == m) && (n < 0 || in->n == n) && (k < 0 || in->k == k))
            return l;
    }
}

static void assert_misaligned_sum(const KernReport *r)
{
    double s = 0;
    int n = 0;
    for (int32_t j = 0; j < r->n_launch; j++) {
        const KernLaunch *l = &r->launch[j];
        if (r->plan->cuda[l->index].kind != PLAN_CU_GEMM) cr_assert_eq(l->misaligned, 0, "a LAUNCH has no rules");
        if (l->misaligned) s += l->seconds, n++;
    }
    cr_assert_eq(r->n_misaligned, n);
    cr_assert_float_eq(r->misaligned_seconds, s, 1e-18);
}

/* mlp's classifier head has K = 4 classes: a row of 4 bf16 is 8 bytes, of 4 f32 16. So in
 * bf16 its three GEMMs fail (the product: B [H, K] and C [B, K]; the bias gradient's: the
 * same; dh = dlogits @ w_out^T: A [B, K] and B read transposed, [H, K]), and in fp32 none. */
Test(kernels, classifier_head_misaligned_in_16_bits)
{
    char err[256], why[256];
    Plan *p = mlp("bf16");
    KernReport *r = report_kernels_new(p, 0, &GPU, err, sizeof err);
    cr_assert(r, "%s", err);
    cr_assert_eq(r->n_gemms, 11);
    cr_assert_eq(r->n_misaligned, 3);
    assert_misaligned_sum(r);
    const KernLaunch *head = gemm(r, "matmul_bias", 64, 4, 64), *bgrad = gemm(r, "matmul_bgrad", 64, 4, 64);
    const KernLaunch *dh = gemm(r, "matmul", 64, 64, 4);
    cr_assert(head && bgrad && dh);
    cr_assert_eq(head->misaligned, BIT(KERN_LDB) | BIT(KERN_LDC));
    cr_assert_eq(bgrad->misaligned, BIT(KERN_LDB) | BIT(KERN_LDC));
    cr_assert_eq(dh->misaligned, BIT(KERN_LDA) | BIT(KERN_LDB));
    cr_assert_str_eq(report_align_describe(p, head->index, head->misaligned, why, sizeof why),
                     "ldb 4 x 2 B, ldc 4 x 2 B");
    cr_assert_str_eq(report_align_describe(p, dh->index, dh->misaligned, why, sizeof why), "lda 4 x 2 B, ldb 4 x 2 B");
    cr_assert_eq(gemm(r, "matmul_bias", 64, 64, 16)->misaligned, 0, "the input layer: rows of 16 and 64");
    report_kernels_free(r);
    plan_free(p);

    p = mlp("fp32");
    r = report_kernels_new(p, 0, &GPU, err, sizeof err);
    cr_assert(r, "%s", err);
    cr_assert_eq(r->n_gemms, 11);
    cr_assert_eq(r->n_misaligned, 0, "rows of 4 f32 are 16 bytes");
    cr_assert_eq(r->misaligned_seconds, 0);
    report_kernels_free(r);
    plan_free(p);
}

/* Tiny GPT-2 (C = 64, V = 256) in bf16: every row a multiple of 8 elements, every param and
 * activation at a 16-byte multiple. At C = 100 rows of C are 200 bytes: the QKV projection
 * fails on A [BT, C], B [C, 3C] and C [BT, 3C]; the MLP's first GEMM on A only (its B and C
 * have rows of 4C = 400 elements, 800 bytes). */
Test(kernels, gpt2_alignment_follows_the_width)
{
    char err[256], why[256];
    const Setting set[] = {{"precision", "bf16"}};
    Plan *p = sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, set, 1, NULL);
    KernReport *r = report_kernels_new(p, 0, &GPU, err, sizeof err);
    cr_assert(r, "%s", err);
    cr_assert_gt(r->n_gemms, 20);
    cr_assert_eq(r->n_misaligned, 0);
    report_kernels_free(r);
    plan_free(p);

    Define dims[6];
    memcpy(dims, SAMPLE_GPT2, sizeof dims);
    for (int i = 0; i < 6; i++)
        if (!strcmp(dims[i].name, "C")) dims[i].value = 100;
    p = sample_compile("gpt2.fsm", dims, 6, set, 1, NULL);
    r = report_kernels_new(p, 0, &GPU, err, sizeof err);
    cr_assert(r, "%s", err);
    assert_misaligned_sum(r);
    const unsigned ld = BIT(KERN_LDA) | BIT(KERN_LDB) | BIT(KERN_LDC);
    const KernLaunch *qkv = gemm(r, "matmul_bias", -1, 300, 100), *fc = gemm(r, "matmul_bias_gelu", -1, 400, 100);
    cr_assert(qkv && fc);
    cr_assert_eq(qkv->misaligned & ld, ld);
    cr_assert_eq(fc->misaligned & ld, BIT(KERN_LDA));
    report_align_describe(p, qkv->index, ld, why, sizeof why);
    cr_assert_str_eq(why, "lda 100 x 2 B, ldb 300 x 2 B, ldc 300 x 2 B");
    report_kernels_free(r);
    plan_free(p);
}

/* Each rule alone, on mlp's fp32 plan (aligned throughout) with one field of its input
 * layer's GEMM (x @ w_in + b_in: m 64, n 64, k 16, f32) changed: the report reads only the
 * plan, so the changed plan is what a plan with that GEMM would be. Misalignment adds
 * nothing to the roofline. */
Test(kernels, each_alignment_rule)
{
    char err[256], why[256];
    Plan *p = mlp("fp32");
    KernReport *r = report_kernels_new(p, 0, &GPU, err, sizeof err);
    cr_assert(r, "%s", err);
    const int32_t i = gemm(r, "matmul_bias", 64, 64, 16)->index;
    const double seconds = gemm(r, "matmul_bias", 64, 64, 16)->seconds;
    report_kernels_free(r);
    PlanCuda *in = &p->cuda[i], saved = *in;
    PlanTensor *bias = &p->tensors[p->ids[in->args + 3]], *C = &p->tensors[p->ids[in->args + 2]];
    const PlanTensor bias_saved = *bias, C_saved = *C;
    cr_assert_eq(in->epilogue, PLAN_EPI_BIAS);
    static const struct {
        const char *field;
        int64_t value;
        unsigned want;
        const char *why;
    } cases[] = {
        {"lda", 17, BIT(KERN_LDA), "lda 17 x 4 B"},
        {"lda", 20, 0, ""},  // 80 bytes
        {"ldc", 66, BIT(KERN_LDC), "ldc 66 x 4 B"},
        {"stride_b", 6, 0, ""},  // batch 1: never stepped
        {"batch_stride_b", 6, BIT(KERN_STRIDE_B), "stride_b 6 x 4 B"},
        {"batch_stride_b", 0, 0, ""},  // broadcast
        {"c_off", 1, BIT(KERN_OFF_C), "offset of C"},
        {"c_off", 4, 0, ""},
        {"bias_offset", 8, BIT(KERN_OFF_BIAS), "offset of bias"},
        {"C_rank_stride", 8, BIT(KERN_OFF_C), "offset of C"},  // rank 1's C starts 8 bytes off
        {"C_rank_stride", 4096, 0, ""},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        *in = saved, *bias = bias_saved, *C = C_saved;
        const char *f = cases[c].field;
        int64_t v = cases[c].value;
        if (!strcmp(f, "lda")) in->lda = v;
        if (!strcmp(f, "ldc")) in->ldc = v;
        if (!strcmp(f, "stride_b")) in->stride_b = v;
        if (!strcmp(f, "batch_stride_b")) in->stride_b = v, in->batch = 2;
        if (!strcmp(f, "c_off")) in->c_off = v;
        if (!strcmp(f, "bias_offset")) bias->offset += v;
        if (!strcmp(f, "C_rank_stride")) C->rank_stride = v;
        r = report_kernels_new(p, 0, &GPU, err, sizeof err);
        cr_assert(r, "%s", err);
        const KernLaunch *l = NULL;
        for (int32_t j = 0; j < r->n_launch; j++)
            if (r->launch[j].index == i) l = &r->launch[j];
        cr_assert(l);
        cr_assert_eq(l->misaligned, cases[c].want, "case %zu (%s %lld): %#x", c, f, (long long)v, l->misaligned);
        cr_assert_str_eq(report_align_describe(p, i, l->misaligned, why, sizeof why), cases[c].why, "case %zu", c);
        cr_assert_eq(r->n_misaligned, cases[c].want != 0, "case %zu: no other GEMM changed", c);
        assert_misaligned_sum(r);
        if (strcmp(f, "batch_stride_b")) cr_assert_float_eq(l->seconds, seconds, 1e-18, "case %zu: no penalty", c);
        report_kernels_free(r);
    }
    plan_free(p);
}
