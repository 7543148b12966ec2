/* tests/unit/test_cpu_attention_qkv.c: the CPU kernels of attention_qkv and its backward
 * (runtime/cpu/attention.c through its layouts) against attention and attention_bwd on the
 * same numbers laid out apart: q [B, NH, T, D], k, v [B, NKV, T, D] gathered from qkv
 * [B, T, (NH + 2 NKV) D] (heads side by side: q's, then k's, then v's), o compared with
 * merge_heads' layout [B, T, NH D], dqkv with dq, dk, dv put back in qkv's. Odd shapes
 * (T = 37 and 300, head dims 24 and 128), grouped-query (NKV = 1 and NH / 2, which only
 * these kernels reach: passes/packed_attn.c matches equal splits), causal and not; f32 to
 * rounding, and bf16 (16-bit slabs staged per batch item) within its rounding. The
 * kernels' GEMMs are the same calls with other leading dimensions, so f32 agrees to a few
 * ulps, not to the bit. attention_rows (Llama's q, k, v as three tensors of rows) on qkv's
 * columns gives attention_qkv's numbers to the bit, and rope_rows rope's on the heads.
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

/* Columns [c0, c0 + n) of x's rows [B, T, W] as a tensor [B, T, n]; put back (to_x) or taken. */
static void columns(const KTensor *x, KTensor *part, int64_t c0, int to_x)
{
    int64_t W = x->shape[2], n = part->shape[2];
    for (int64_t r = 0; r < x->numel / W; r++)
        for (int64_t e = 0; e < n; e++)
            if (to_x)
                F(x)[r * W + c0 + e] = F(part)[r * n + e];
            else
                F(part)[r * n + e] = F(x)[r * W + c0 + e];
}

/* attention_rows and its backward on q, k, v as three tensors [B, T, heads D] (Llama's projections' rows), the
 * columns of x, give attention_qkv's o and lse (the same calls on other pointers: to the bit) and its dqkv's
 * columns. */
static void rows_agree(const Dims *d, const KTensor *x, const KTensor *o, const KTensor *lse, const KTensor *dout,
                       const KTensor *dx, int causal)
{
    int64_t w[3] = {d->NH * d->D, d->NKV * d->D, d->NKV * d->D}, c0[3] = {0, w[0], w[0] + w[1]};
    KTensor in[3], g[3], or = tensor(KT_F32, SH(d->B, d->T, w[0])), lr = tensor(KT_F32, SH(d->B, d->NH, d->T));
    KTensor back = tensor(KT_F32, SH(d->B, d->T, x->shape[2]));
    for (int i = 0; i < 3; i++) {
        in[i] = tensor(KT_F32, SH(d->B, d->T, w[i])), g[i] = tensor(KT_F32, SH(d->B, d->T, w[i]));
        columns(x, &in[i], c0[i], 0);
    }
    KCall f = {.n_in = 3, .in = {in[0], in[1], in[2]}, .n_out = 2, .out = {or, lr},
               .attr = {[3] = (double)d->NH, [4] = (double)d->NKV, [5] = causal}};
    cpu_attention_rows(&f);
    KCall b = {.n_in = 6, .in = {in[0], in[1], in[2], or, lr, *dout}, .n_out = 3, .out = {g[0], g[1], g[2]},
               .attr = {[6] = (double)d->NH, [7] = (double)d->NKV, [8] = causal}};
    cpu_attention_rows_bwd(&b);
    for (int i = 0; i < 3; i++) columns(&back, &g[i], c0[i], 1);
    cr_expect(!memcmp(or.data, o->data, sizeof(float) * (size_t)or.numel) &&
                  !memcmp(lr.data, lse->data, sizeof(float) * (size_t)lr.numel) &&
                  !memcmp(back.data, dx->data, sizeof(float) * (size_t)back.numel),
              "B%lld NH%lld NKV%lld T%lld D%lld causal %d: attention_rows differs from attention_qkv: o %.3g lse %.3g "
              "d %.3g", (long long)d->B, (long long)d->NH, (long long)d->NKV, (long long)d->T, (long long)d->D, causal,
              worst_rel(F(&or), F(o), or.numel), worst_rel(F(&lr), F(lse), lr.numel),
              worst_rel(F(&back), F(dx), back.numel));
    for (int i = 0; i < 3; i++) free(in[i].data), free(g[i].data);
    free(or.data), free(lr.data), free(back.data);
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
    rows_agree(&d, &x, &o, &lse, &dout, &dx, causal);

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

/* rope_rows on [B, T, n D] rows turns each head as rope turns heads(x, n) [B, n, T, D] (the same arithmetic: to
 * the bit), in both forms, and its inverse (rope's backward) turns it back. */
Test(cpu_attention_qkv, rope_rows_is_rope_of_the_heads)
{
    int64_t B = 2, n = 3, T = 37, D = 24;
    KTensor x = tensor(KT_F32, SH(B, T, n * D)), y = tensor(KT_F32, SH(B, T, n * D));
    KTensor z = tensor(KT_F32, SH(B, T, n * D));
    KTensor h = tensor(KT_F32, SH(B, n, T, D)), hy = tensor(KT_F32, SH(B, n, T, D));
    for (int64_t i = 0; i < x.numel; i++) F(&x)[i] = (float)((i * 37) % 101) / 50 - 1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < n; j++)
                memcpy(&F(&h)[((b * n + j) * T + t) * D], &F(&x)[((b * T + t) * n + j) * D], sizeof(float) * (size_t)D);
    for (int interleaved = 0; interleaved < 2; interleaved++) {
        KCall r = {.n_in = 1, .in = {x}, .n_out = 1, .out = {y}, .attr = {0, (double)n, 500, 0, interleaved}};
        cpu_rope_rows(&r);
        KCall a = {.n_in = 1, .in = {h}, .n_out = 1, .out = {hy}, .attr = {0, 500, 0, interleaved}};
        cpu_rope(&a);
        int same = 1;
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t j = 0; j < n; j++)
                    same &= !memcmp(&F(&hy)[((b * n + j) * T + t) * D], &F(&y)[((b * T + t) * n + j) * D],
                                    sizeof(float) * (size_t)D);
        cr_expect(same, "interleaved %d: rope_rows differs from rope of the heads", interleaved);
        KCall inv = {.n_in = 1, .in = {y}, .n_out = 1, .out = {z}, .attr = {0, (double)n, 500, 1, interleaved}};
        cpu_rope_rows(&inv);
        cr_expect(worst_rel(F(&z), F(&x), x.numel) < 1e-6, "interleaved %d: the inverse does not turn it back",
                  interleaved);
    }
    KTensor all[] = {x, y, z, h, hy};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i].data);
}
