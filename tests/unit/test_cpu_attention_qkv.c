/* tests/unit/test_cpu_attention_qkv.c: the CPU kernels of attention_qkv and its backward
 * (runtime/cpu/attention.c through its layouts) against attention and attention_bwd on the
 * same numbers laid out apart: q [B, NH, T, D], k, v [B, NKV, T, D] gathered from qkv
 * [B, T, (NH + 2 NKV) D] (heads side by side: q's, then k's, then v's), o compared with
 * merge_heads' layout [B, T, NH D], dqkv with dq, dk, dv put back in qkv's. Odd shapes
 * (T = 37 and 300, head dims 24 and 128), grouped-query (NKV = 1 and NH / 2, which only
 * these kernels reach: passes/packed_attn.c matches equal splits), causal and not; f32 to
 * rounding, and bf16 (16-bit slabs staged per batch item) within its rounding. The
 * kernels' GEMMs are the same calls with other leading dimensions, so f32 agrees to a few
 * ulps, not to the bit.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"

typedef struct {
    int64_t B, NH, NKV, T, D;
} Dims;

static KTensor tensor(int dtype, int rank, const int64_t *shape)
{
    KTensor t = {.dtype = dtype, .rank = rank, .numel = 1};
    for (int i = 0; i < rank; i++) t.shape[i] = shape[i], t.numel *= shape[i];
    t.data = calloc((size_t)t.numel, dtype == KT_F32 ? 4 : 2);
    cr_assert(t.data);
    return t;
}

#define SH(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

static float *F(const KTensor *t) { return (float *)t->data; }

/* Element (b, t, column c) of qkv's rows <-> element of head h's slice [B, H, T, D]. */
static int64_t packed_at(const Dims *d, int64_t b, int64_t t, int64_t col)
{
    return (b * d->T + t) * (d->NH + 2 * d->NKV) * d->D + col;
}

/* Copies between the packed qkv (or dqkv) and the three apart; to_packed picks the way. */
static void repack(const Dims *d, float *qkv, float *q, float *k, float *v, int to_packed)
{
    int64_t heads[3] = {d->NH, d->NKV, d->NKV}, first[3] = {0, d->NH, d->NH + d->NKV};
    float *parts[3] = {q, k, v};
    for (int p = 0; p < 3; p++)
        for (int64_t b = 0; b < d->B; b++)
            for (int64_t h = 0; h < heads[p]; h++)
                for (int64_t t = 0; t < d->T; t++)
                    for (int64_t e = 0; e < d->D; e++) {
                        float *x = &qkv[packed_at(d, b, t, (first[p] + h) * d->D + e)];
                        float *y = &parts[p][((b * heads[p] + h) * d->T + t) * d->D + e];
                        if (to_packed)
                            *x = *y;
                        else
                            *y = *x;
                    }
}

static double worst_rel(const float *a, const float *b, int64_t n)
{
    double most = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) most = fmax(most, fabs(b[i]));
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
    return worst / (most > 0 ? most : 1);
}

static void check(Dims d, int causal, double tol)
{
    int64_t W = (d.NH + 2 * d.NKV) * d.D;
    KTensor x = tensor(KT_F32, SH(d.B, d.T, W)), o = tensor(KT_F32, SH(d.B, d.T, d.NH * d.D));
    KTensor lse = tensor(KT_F32, SH(d.B, d.NH, d.T)), dout = tensor(KT_F32, SH(d.B, d.T, d.NH * d.D));
    KTensor dx = tensor(KT_F32, SH(d.B, d.T, W));
    KTensor q = tensor(KT_F32, SH(d.B, d.NH, d.T, d.D)), k = tensor(KT_F32, SH(d.B, d.NKV, d.T, d.D));
    KTensor v = tensor(KT_F32, SH(d.B, d.NKV, d.T, d.D)), oa = tensor(KT_F32, SH(d.B, d.NH, d.T, d.D));
    KTensor la = tensor(KT_F32, SH(d.B, d.NH, d.T)), ga = tensor(KT_F32, SH(d.B, d.NH, d.T, d.D));
    KTensor dq = tensor(KT_F32, SH(d.B, d.NH, d.T, d.D)), dk = tensor(KT_F32, SH(d.B, d.NKV, d.T, d.D));
    KTensor dv = tensor(KT_F32, SH(d.B, d.NKV, d.T, d.D)), back = tensor(KT_F32, SH(d.B, d.T, W));
    srand(7);
    for (int64_t i = 0; i < x.numel; i++) F(&x)[i] = (float)rand() / RAND_MAX * 2 - 1;
    for (int64_t i = 0; i < ga.numel; i++) F(&ga)[i] = (float)rand() / RAND_MAX * 2 - 1;
    repack(&d, F(&x), F(&q), F(&k), F(&v), 0);
    // dO in merge_heads' layout: head h of row t at columns h D ..
    for (int64_t b = 0; b < d.B; b++)
        for (int64_t h = 0; h < d.NH; h++)
            for (int64_t t = 0; t < d.T; t++)
                memcpy(&F(&dout)[((b * d.T + t) * d.NH + h) * d.D], &F(&ga)[((b * d.NH + h) * d.T + t) * d.D],
                       sizeof(float) * (size_t)d.D);

    KCall a = {.n_in = 3, .in = {q, k, v}, .n_out = 2, .out = {oa, la}, .attr = {[3] = causal}};
    cpu_attention(&a);
    KCall ab = {.n_in = 6, .in = {q, k, v, oa, la, ga}, .n_out = 3, .out = {dq, dk, dv}, .attr = {[6] = causal}};
    cpu_attention_bwd(&ab);
    KCall p = {.n_in = 1, .in = {x}, .n_out = 2, .out = {o, lse}, .attr = {0, (double)d.NH, (double)d.NKV, causal}};
    cpu_attention_qkv(&p);
    KCall pb = {.n_in = 4, .in = {x, o, lse, dout}, .n_out = 1, .out = {dx},
                .attr = {[4] = (double)d.NH, [5] = (double)d.NKV, [6] = causal}};
    cpu_attention_qkv_bwd(&pb);

    float *om = malloc(sizeof(float) * (size_t)o.numel);  // the apart output in merge_heads' layout
    for (int64_t b = 0; b < d.B; b++)
        for (int64_t h = 0; h < d.NH; h++)
            for (int64_t t = 0; t < d.T; t++)
                memcpy(&om[((b * d.T + t) * d.NH + h) * d.D], &F(&oa)[((b * d.NH + h) * d.T + t) * d.D],
                       sizeof(float) * (size_t)d.D);
    repack(&d, F(&back), F(&dq), F(&dk), F(&dv), 1);
    double eo = worst_rel(F(&o), om, o.numel), el = worst_rel(F(&lse), F(&la), lse.numel);
    double ed = worst_rel(F(&dx), F(&back), dx.numel);
    cr_log_info("B%lld NH%lld NKV%lld T%lld D%lld causal %d: o %.2g lse %.2g dqkv %.2g", (long long)d.B,
                (long long)d.NH, (long long)d.NKV, (long long)d.T, (long long)d.D, causal, eo, el, ed);
    cr_expect(eo <= tol && el <= tol && ed <= tol, "B%lld NH%lld NKV%lld T%lld D%lld causal %d: o %.3g lse %.3g "
              "dqkv %.3g", (long long)d.B, (long long)d.NH, (long long)d.NKV, (long long)d.T, (long long)d.D, causal,
              eo, el, ed);
    KTensor all[] = {x, o, lse, dout, dx, q, k, v, oa, la, ga, dq, dk, dv, back};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i].data);
    free(om);
}

Test(cpu_attention_qkv, equal_heads_odd_lengths)
{
    for (int causal = 0; causal < 2; causal++) {
        check((Dims){2, 3, 3, 37, 24}, causal, 1e-5);
        check((Dims){1, 2, 2, 300, 128}, causal, 1e-5);
    }
}

Test(cpu_attention_qkv, grouped_query)
{
    for (int causal = 0; causal < 2; causal++) {
        check((Dims){3, 4, 1, 37, 24}, causal, 1e-5);    // multi-query
        check((Dims){1, 4, 2, 300, 128}, causal, 1e-5);  // NKV = NH / 2, several tiles
    }
}

/* Every (batch, head) slice of q has its own lse row, and rows past a causal diagonal see
 * only earlier keys: the packed layout's lse of row 0 is its one score. */
Test(cpu_attention_qkv, first_causal_row_sees_itself)
{
    Dims d = {1, 2, 1, 5, 8};
    int64_t W = (d.NH + 2 * d.NKV) * d.D;
    KTensor x = tensor(KT_F32, SH(1, 5, W)), o = tensor(KT_F32, SH(1, 5, 16)), lse = tensor(KT_F32, SH(1, 2, 5));
    for (int64_t i = 0; i < x.numel; i++) F(&x)[i] = (float)(i % 7) * 0.25f - 0.5f;
    KCall p = {.n_in = 1, .in = {x}, .n_out = 2, .out = {o, lse}, .attr = {0, 2, 1, 1}};
    cpu_attention_qkv(&p);
    for (int h = 0; h < 2; h++) {
        double s = 0;
        for (int e = 0; e < 8; e++) s += (double)F(&x)[h * 8 + e] * F(&x)[16 + e];
        cr_expect(fabs(F(&lse)[h * 5] - s / sqrt(8.0)) < 1e-6, "head %d: lse %g, want %g", h, F(&lse)[h * 5],
                  s / sqrt(8.0));
        for (int e = 0; e < 8; e++)
            cr_expect(F(&o)[h * 8 + e] == F(&x)[24 + e], "head %d: row 0 is v's row 0", h);
    }
    free(x.data), free(o.data), free(lse.data);
}

/* A bf16 tensor of f32 values, rounded. */
static KTensor to_bf16(const KTensor *t)
{
    KTensor b = tensor(KT_BF16, t->rank, t->shape);
    for (int64_t i = 0; i < t->numel; i++) ((uint16_t *)b.data)[i] = cpu_f32_to_bf16(F(t)[i]);
    return b;
}

static void from_bf16(const KTensor *b, float *out)
{
    for (int64_t i = 0; i < b->numel; i++) out[i] = cpu_bf16_to_f32(((const uint16_t *)b->data)[i]);
}

/* bf16 runs as its f32 self on staged batch items (a workspace of one item, so several groups):
 * the f32 kernels' results on the rounded inputs, rounded once. */
Test(cpu_attention_qkv, bf16_staged_by_batch_items)
{
    Dims d = {3, 4, 2, 37, 24};
    int64_t W = (d.NH + 2 * d.NKV) * d.D, C = d.NH * d.D;
    KTensor x = tensor(KT_F32, SH(d.B, d.T, W)), g = tensor(KT_F32, SH(d.B, d.T, C));
    for (int64_t i = 0; i < x.numel; i++) F(&x)[i] = cpu_bf16_to_f32(cpu_f32_to_bf16((float)((i * 37) % 101) / 50 - 1));
    for (int64_t i = 0; i < g.numel; i++) F(&g)[i] = cpu_bf16_to_f32(cpu_f32_to_bf16((float)((i * 13) % 89) / 44 - 1));
    KTensor o = tensor(KT_F32, SH(d.B, d.T, C)), lse = tensor(KT_F32, SH(d.B, d.NH, d.T));
    KTensor dx = tensor(KT_F32, SH(d.B, d.T, W));
    KCall p = {.n_in = 1, .in = {x}, .n_out = 2, .out = {o, lse}, .attr = {0, 4, 2, 1}};
    cpu_attention_qkv(&p);
    for (int64_t i = 0; i < o.numel; i++) F(&o)[i] = cpu_bf16_to_f32(cpu_f32_to_bf16(F(&o)[i]));
    KCall pb = {.n_in = 4, .in = {x, o, lse, g}, .n_out = 1, .out = {dx}, .attr = {[4] = 4, [5] = 2, [6] = 1}};
    cpu_attention_qkv_bwd(&pb);

    KTensor xb = to_bf16(&x), gb = to_bf16(&g), ob = tensor(KT_BF16, SH(d.B, d.T, C));
    KTensor lb = tensor(KT_F32, SH(d.B, d.NH, d.T));
    KTensor dxb = tensor(KT_BF16, SH(d.B, d.T, W));
    KCall q = {.n_in = 1, .in = {xb}, .n_out = 2, .out = {ob, lb}, .attr = {0, 4, 2, 1}};
    KCall qb = {.n_in = 4, .in = {xb, ob, lb, gb}, .n_out = 1, .out = {dxb}, .attr = {[4] = 4, [5] = 2, [6] = 1}};
    CpuWork wf = cpu_work(cpu_attention_qkv, &q), wb = cpu_work(cpu_attention_qkv_bwd, &qb);
    cr_assert(wf.least > 0 && wb.least > 0 && wb.least < wb.all, "a workspace of one batch item at least");
    float *work = malloc(sizeof(float) * wb.least);
    q.work = qb.work = work, q.work_floats = wf.least, qb.work_floats = wb.least;
    cpu_attention_qkv(&q);
    cpu_attention_qkv_bwd(&qb);
    float *ob32 = malloc(sizeof(float) * (size_t)o.numel), *dx32 = malloc(sizeof(float) * (size_t)dx.numel);
    from_bf16(&ob, ob32), from_bf16(&dxb, dx32);
    double eo = worst_rel(ob32, F(&o), o.numel), el = worst_rel(F(&lb), F(&lse), lse.numel);
    double ed = worst_rel(dx32, F(&dx), dx.numel);
    cr_expect(eo <= 1e-2 && el <= 1e-5 && ed <= 1e-2, "bf16: o %.3g, lse %.3g, dqkv %.3g", eo, el, ed);
    KTensor all[] = {x, g, o, lse, dx, xb, gb, ob, lb, dxb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i].data);
    free(work), free(ob32), free(dx32);
}
