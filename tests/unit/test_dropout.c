/* tests/unit/test_dropout.c: dropout's generator, CPU kernel, gradient and evaluation.
 *
 * Philox4x32-10 (ops/philox.h) against the Random123 known-answer vectors; the kernel
 * (runtime/cpu/dropout.c) against PyTorch's training-mode semantics: kept elements are
 * x / (1 - p) exactly, dropped ones 0, the kept fraction 1 - p within 6 binomial sigma
 * over 1e6 elements; the mask is a function of (seed, step, op, global element) alone,
 * so a rank's or a micro-batch's part of a batch-leading tensor is that part of the
 * whole tensor's mask. Through the compiler and the executor: the backward's mask is the
 * forward's (dx = dy / (1 - p) where y was kept, 0 exactly where it was dropped), it
 * reads no saved mask, and passes_eval_identity takes every dropout out.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "philox.h"
#include "sample.h"

Test(dropout, philox_known_answers)
{
    /* Random123's kat_vectors for philox4x32_10: counter, key (k0, k1), output. */
    static const struct {
        uint32_t ctr[4], k0, k1, out[4];
    } kat[] = {
        {{0, 0, 0, 0}, 0, 0, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, 0xffffffff, 0xffffffff,
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, 0xa4093822, 0x299f31d0,
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof *kat; i++) {
        unsigned out[4];
        fs_philox((unsigned long long)kat[i].k1 << 32 | kat[i].k0, kat[i].ctr[0], kat[i].ctr[1], kat[i].ctr[2],
                  kat[i].ctr[3], out);
        for (int j = 0; j < 4; j++) cr_expect_eq(out[j], kat[i].out[j], "vector %zu word %d: %08x", i, j, out[j]);
    }
}

typedef struct {
    uint64_t seed;
    int32_t step, rank;
    double p;
    int key, batch, mb, mbs;
} Key;

/* y = dropout(x) for one call of the kernel, x f32 [n]. */
static void run(const Key *k, const float *x, float *y, int64_t n)
{
    int32_t rng[4] = {(int32_t)(uint32_t)k->seed, (int32_t)(uint32_t)(k->seed >> 32), k->step, k->rank};
    KCall c = {.n_in = 2, .n_out = 1};
    c.in[0] = (KTensor){.data = (void *)x, .dtype = KT_F32, .rank = 1, .shape = {n}, .numel = n};
    c.in[1] = (KTensor){.data = rng, .dtype = KT_I32, .rank = 1, .shape = {4}, .numel = 4};
    c.out[0] = (KTensor){.data = y, .dtype = KT_F32, .rank = 1, .shape = {n}, .numel = n};
    c.attr[2] = k->p, c.attr[3] = k->key, c.attr[4] = k->batch, c.attr[5] = k->mb, c.attr[6] = k->mbs;
    cpu_dropout(&c);
}

static float *ramp(int64_t n)
{
    float *x = malloc(sizeof *x * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = 0.5f + (float)(i % 1000) / 1000.0f;  // never 0
    return x;
}

Test(dropout, pytorch_semantics_and_statistics)
{
    const int64_t n = 1000000;
    float *x = ramp(n), *y = malloc(sizeof *y * (size_t)n);
    static const double ps[] = {0.1, 0.5, 0.9};
    for (int t = 0; t < 3; t++) {
        Key k = {.seed = 1234, .step = 1, .p = ps[t], .key = 3, .mbs = 1};
        run(&k, x, y, n);
        float scale = (float)(1.0 / (1.0 - ps[t]));
        int64_t kept = 0;
        double sum_x = 0, sum_y = 0;
        for (int64_t i = 0; i < n; i++) {
            cr_assert(y[i] == 0.0f || y[i] == x[i] * scale, "p %g, element %lld: %g from %g", ps[t], (long long)i,
                      y[i], x[i]);
            kept += y[i] != 0.0f;
            sum_x += x[i], sum_y += y[i];
            /* What the CUDA kernels call, element by element. */
            if (i < 4096)
                cr_assert_eq(fs_dropout_keep(1234, 1, 3, (unsigned long long)i, fs_dropout_threshold(ps[t])), y[i] != 0.0f);
        }
        double q = 1 - ps[t], sigma = sqrt((double)n * q * (1 - q));
        cr_expect(fabs((double)kept - (double)n * q) <= 6 * sigma, "p %g: kept %lld of %lld, expected %.0f +- %.0f",
                  ps[t], (long long)kept, (long long)n, n * q, 6 * sigma);
        /* E[y] = x: the mean is kept (within 6 sigma of the masked sum's spread). */
        cr_expect(fabs(sum_y - sum_x) <= 6 * sqrt((double)n * ps[t] / q) * 1.5, "p %g: sum %g vs %g", ps[t], sum_y, sum_x);
    }
    free(x);
    free(y);
}

static int64_t differing(const Key *a, const Key *b, int64_t n)
{
    float *x = ramp(n), *ya = malloc(sizeof *ya * (size_t)n), *yb = malloc(sizeof *yb * (size_t)n);
    run(a, x, ya, n);
    run(b, x, yb, n);
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += (ya[i] != 0) != (yb[i] != 0);
    free(x), free(ya), free(yb);
    return d;
}

Test(dropout, keyed_by_seed_step_op)
{
    const int64_t n = 100000;
    Key base = {.seed = 0x1234567890ull, .step = 7, .p = 0.5, .key = 2, .mbs = 1};
    cr_expect_eq(differing(&base, &base, n), 0, "the same key draws the same mask");
    Key seed = base, step = base, op = base, high = base;
    seed.seed ^= 1, step.step = 8, op.key = 3, high.seed ^= 1ull << 40;
    const Key *other[] = {&seed, &step, &op, &high};
    for (int i = 0; i < 4; i++) {
        int64_t d = differing(&base, other[i], n);  // independent masks differ in half the elements
        cr_expect(d > n / 2 - 3000 && d < n / 2 + 3000, "change %d: %lld of %lld differ", i, (long long)d, (long long)n);
    }
}

/* A rank's (and a micro-batch's) part of a batch-leading tensor draws that part of the
 * whole tensor's mask: world and micro-batch count do not change the training. */
Test(dropout, parts_of_the_global_batch)
{
    const int64_t n = 4099, parts = 6;  // odd: the parts' first elements fall inside Philox blocks
    float *x = ramp(n * parts), *whole = malloc(sizeof *whole * (size_t)(n * parts)), *y = malloc(sizeof *y * (size_t)n);
    Key k = {.seed = 99, .step = 3, .p = 0.3, .key = 1, .mbs = 1};
    run(&k, x, whole, n * parts);
    for (int rank = 0; rank < 3; rank++)
        for (int mb = 0; mb < 2; mb++) {
            Key part = {.seed = 99, .step = 3, .rank = rank, .p = 0.3, .key = 1, .batch = 1, .mb = mb, .mbs = 2};
            int64_t at = (rank * 2 + mb) * n;
            run(&part, x + at, y, n);
            cr_assert_eq(memcmp(y, whole + at, sizeof *y * (size_t)n), 0, "rank %d micro-batch %d", rank, mb);
        }
    Key unbatched = {.seed = 99, .step = 3, .rank = 2, .p = 0.3, .key = 1, .batch = 0, .mbs = 1};
    run(&unbatched, x, y, n);  // not a part of the batch: every rank draws the whole tensor's mask
    cr_expect_eq(memcmp(y, whole, sizeof *y * (size_t)n), 0);
    free(x), free(whole), free(y);
}

Test(dropout, sixteen_bit_is_the_f32_result_rounded)
{
    enum { N = 5000 };
    float x[N], y32[N];
    uint16_t xb[N], yb[N];
    for (int i = 0; i < N; i++) xb[i] = cpu_f32_to_bf16((float)(i % 97) * 0.37f - 17.0f), x[i] = cpu_bf16_to_f32(xb[i]);
    Key k = {.seed = 5, .step = 2, .p = 0.15, .key = 4, .mbs = 1};
    run(&k, x, y32, N);
    int32_t rng[4] = {5, 0, 2, 0};
    KCall c = {.n_in = 2, .n_out = 1};
    c.in[0] = (KTensor){.data = xb, .dtype = KT_BF16, .rank = 1, .shape = {N}, .numel = N};
    c.in[1] = (KTensor){.data = rng, .dtype = KT_I32, .rank = 1, .shape = {4}, .numel = 4};
    c.out[0] = (KTensor){.data = yb, .dtype = KT_BF16, .rank = 1, .shape = {N}, .numel = N};
    c.attr[2] = 0.15, c.attr[3] = 4, c.attr[6] = 1;
    cpu_dropout(&c);
    for (int i = 0; i < N; i++) cr_assert_eq(yb[i], cpu_f32_to_bf16(y32[i]), "element %d", i);
}

/* ---- through the compiler and the executor ------------------------------------------ */

static const char MODEL[] = "model t {\n"
                            "  input R: f32[64, 32];\n"
                            "  param a: [64, 32] = normal(1);\n"
                            "  y = dropout(a, 0.3);\n"
                            "  output y;\n"
                            "  loss = sum(reshape(y * R, [-1]));\n"
                            "}\n";

Test(dropout, backward_mask_is_the_forward_mask)
{
    Plan *p = sample_compile_source("t.fsm", MODEL, NULL, 0, NULL, 0, NULL);
    char err[256];
    ExecOptions eo = {.seed = 11};
    Exec *e = rt_exec_new(p, &eo, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    RtTensor r, a, y, g;
    cr_assert_eq(rt_exec_tensor(e, "R", &r), 0);
    for (int64_t i = 0; i < r.numel; i++) ((float *)r.data)[i] = (float)(i % 13) - 6.5f;  // never 0
    cr_assert_eq(rt_exec_run(e, 1, RT_PHASE(PLAN_PHASE_FORWARD) | RT_PHASE(PLAN_PHASE_BACKWARD)), 0);
    cr_assert_eq(rt_exec_tensor(e, "a", &a) || rt_exec_tensor(e, "y", &y) || rt_exec_tensor(e, "a.grad", &g), 0);
    const float *av = a.data, *yv = y.data, *gv = g.data, *rv = r.data, scale = (float)(1.0 / 0.7);
    int64_t kept = 0;
    for (int64_t i = 0; i < a.numel; i++) {
        int keep = yv[i] != 0.0f;
        kept += keep;
        cr_assert_eq(yv[i], keep ? av[i] * scale : 0.0f, "y[%lld]", (long long)i);
        cr_assert_eq(gv[i], keep ? rv[i] * scale : 0.0f, "grad[%lld]: %g, y %g", (long long)i, gv[i], yv[i]);
    }
    cr_expect(kept > a.numel / 2 && kept < a.numel * 9 / 10, "kept %lld of %lld", (long long)kept, (long long)a.numel);
    /* The backward's dropout reads dy and the RNG words: no mask, no x. */
    int backward = 0;
    for (int32_t k = 0; k < p->n_ops; k++) {
        const PlanOp *op = &p->ops[k];
        if (strcmp(plan_str(p, op->op), "dropout") || op->phase != PLAN_PHASE_BACKWARD) continue;
        backward++;
        cr_assert_eq(op->n_in, 2);
        const PlanTensor *dy = &p->tensors[p->ids[op->in]], *rng = &p->tensors[p->ids[op->in + 1]];
        cr_expect(dy->producer != PLAN_NONE && p->ops[dy->producer].phase == PLAN_PHASE_BACKWARD, "reads a forward tensor");
        cr_expect_eq(rng->step_role, PLAN_SR_RNG);
        cr_expect_eq(plan_tensor_nbytes(rng), 16);
    }
    cr_expect_eq(backward, 1);
    /* Another step draws another mask. */
    float *y1 = malloc(sizeof(float) * (size_t)y.numel);
    memcpy(y1, yv, sizeof(float) * (size_t)y.numel);
    cr_assert_eq(rt_exec_run(e, 2, RT_PHASE(PLAN_PHASE_FORWARD)), 0);
    int64_t moved = 0;
    for (int64_t i = 0; i < y.numel; i++) moved += (y1[i] != 0) != (yv[i] != 0);
    cr_expect(moved > y.numel / 5, "step 2 moved %lld of %lld", (long long)moved, (long long)y.numel);
    free(y1);
    rt_exec_free(e);
    plan_free(p);
}

Test(dropout, evaluation_is_the_identity)
{
    Diag d;
    diag_init(&d, "t.fsm", MODEL, strlen(MODEL), stderr);
    FrontendOptions fo = {0};
    Options o = {0};
    Graph *g = fe_compile(MODEL, strlen(MODEL), &fo, &o.train, &d);
    cr_assert_not_null(g);
    cr_assert_eq(passes_eval_identity(g), 1);
    cr_assert_eq(passes_run(g, &o, &d), 0);
    for (int n = 0; n < g->n_nodes; n++) cr_expect_neq(g->nodes[n].op, OP_dropout, "node %d is a dropout", n);
    ir_graph_free(g);
}
