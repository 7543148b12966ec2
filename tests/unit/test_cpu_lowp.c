/* tests/unit/test_cpu_lowp.c: every CPU kernel on f16 and bf16 storage.
 *
 * Each case is an f32 call whose float inputs are rounded to the 16-bit dtype first, so
 * that the f32 kernel and the 16-bit kernel see the same values. The 16-bit call (the
 * same call with those tensors in 16 bits, outputs in the dtype the shape rule gives)
 * must then give the f32 result rounded once: bit for bit for pointwise and layout
 * ops, and for the reductions, norms, rope and the loss too (they run the f32 code on
 * the same values, in the same order); matmul and attention within 1e-3 (f16) or 1e-2
 * (bf16) relative. The same 16-bit call gives the same bits at 1 and 2 threads, and
 * with a workspace so small that every kernel works in pieces (matmul: stays close).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "ops.h"
#include "rand.h"
#include "tensors.h"

/* ---- tensors, freed after each test ---------------------------------------------- */

TestSuite(lowp, .fini = tensors_free);


static int esz(int dt) { return dt == KT_F16 || dt == KT_BF16 ? 2 : 4; }

/* A tensor of all-ones bytes: NaN in every float dtype, so unwritten outputs show. */
static KTensor ten(int dtype, int rank, const int64_t *shape)
{
    KTensor t = {.dtype = dtype, .rank = rank, .numel = 1};
    for (int d = 0; d < rank; d++) t.shape[d] = shape[d], t.numel *= shape[d];
    t.data = track((size_t)t.numel * (size_t)esz(dtype));
    memset(t.data, 0xff, (size_t)t.numel * (size_t)esz(dtype));
    return t;
}

static float *F(const KTensor *t) { return (float *)t->data; }
static int32_t *IV(const KTensor *t) { return (int32_t *)t->data; }
static uint16_t *H(const KTensor *t) { return (uint16_t *)t->data; }

static KTensor frand(int rank, const int64_t *shape, float lo, float hi)
{
    KTensor t = ten(KT_F32, rank, shape);
    for (int64_t i = 0; i < t.numel; i++) F(&t)[i] = urand(lo, hi);
    return t;
}

static KTensor irand(int rank, const int64_t *shape, int32_t n)
{
    KTensor t = ten(KT_I32, rank, shape);
    for (int64_t i = 0; i < t.numel; i++) IV(&t)[i] = (int32_t)urand(0, (float)n - 0.01f);
    return t;
}

static KTensor fscalar(float v)
{
    KTensor t = ten(KT_F32, 0, NULL);
    F(&t)[0] = v;
    return t;
}

static KTensor like(const KTensor *t) { return ten(t->dtype, t->rank, t->shape); }

static uint16_t to16(int dt, float v) { return dt == KT_F16 ? cpu_f32_to_f16(v) : cpu_f32_to_bf16(v); }
static float from16(int dt, uint16_t h) { return dt == KT_F16 ? cpu_f16_to_f32(h) : cpu_bf16_to_f32(h); }

static const char *dname(int dt) { return dt == KT_F16 ? "f16" : "bf16"; }

/* ---- cases ------------------------------------------------------------------------- */

#define KEEP_IN(i) (1u << (i))        // input i stays f32 in the 16-bit call
#define KEEP_OUT(i) (1u << (16 + (i))) // output i stays f32

typedef struct {
    CpuKernel f;
    KCall k;        // the f32 call
    unsigned keep;  // KEEP_* bits; i32 tensors stay i32 anyway
} Case;

static KCall call(int n_in, const KTensor *in, int n_out, const KTensor *out)
{
    KCall k = {.n_in = n_in, .n_out = n_out};
    for (int i = 0; i < n_in; i++) k.in[i] = in[i];
    for (int i = 0; i < n_out; i++) k.out[i] = out[i];
    return k;
}

static int lowp_in(const Case *c, int i) { return c->k.in[i].dtype == KT_F32 && !(c->keep & KEEP_IN(i)); }
static int lowp_out(const Case *c, int i) { return c->k.out[i].dtype == KT_F32 && !(c->keep & KEEP_OUT(i)); }

/* Rounds the f32 inputs that go 16-bit to values dt holds exactly. */
static void round_inputs(Case *c, int dt)
{
    for (int i = 0; i < c->k.n_in; i++)
        if (lowp_in(c, i))
            for (int64_t j = 0; j < c->k.in[i].numel; j++) F(&c->k.in[i])[j] = from16(dt, to16(dt, F(&c->k.in[i])[j]));
}

/* The 16-bit twin of the f32 call: inputs converted (exactly), fresh outputs. */
static KCall lowp_twin(const Case *c, int dt, size_t work_floats)
{
    KCall k = c->k;
    for (int i = 0; i < k.n_in; i++) {
        if (!lowp_in(c, i)) continue;
        KTensor t = ten(dt, k.in[i].rank, k.in[i].shape);
        for (int64_t j = 0; j < t.numel; j++) H(&t)[j] = to16(dt, F(&c->k.in[i])[j]);
        k.in[i] = t;
    }
    for (int i = 0; i < k.n_out; i++) k.out[i] = ten(lowp_out(c, i) ? dt : k.out[i].dtype, k.out[i].rank, k.out[i].shape);
    k.work = work_floats ? track(work_floats * sizeof(float)) : NULL;
    k.work_floats = work_floats;
    return k;
}

/* The workspace the executor would give this call (kernels.h: least, up to 8 Mi floats of all). */
static size_t exec_work(CpuKernel f, const KCall *k)
{
    CpuWork w = cpu_work(f, k);
    size_t n = w.all < ((size_t)8 << 20) ? w.all : ((size_t)8 << 20);
    return w.least > n ? w.least : n;
}

/* Distance in units in the last place between two 16-bit floats of one sign convention. */
static int64_t ulps16(uint16_t a, uint16_t b)
{
    int32_t x = a & 0x8000 ? -(int32_t)(a & 0x7fff) : (int32_t)a, y = b & 0x8000 ? -(int32_t)(b & 0x7fff) : (int32_t)b;
    return x > y ? x - y : y - x;
}

/* Output i of the 16-bit call against the f32 call's output rounded: within ulps (f32
 * outputs: bit for bit when ulps is 0, else within rel), or within rel when rel > 0. */
static int compare(const Case *c, const KCall *l, int dt, int ulps, double rel, const char *what)
{
    for (int i = 0; i < l->n_out; i++) {
        const KTensor *want = &c->k.out[i], *got = &l->out[i];
        for (int64_t j = 0; j < want->numel; j++) {
            float w = want->dtype == KT_F32 ? F(want)[j] : (float)IV(want)[j];
            if (got->dtype == KT_F32 || got->dtype == KT_I32) {
                float g = got->dtype == KT_F32 ? F(got)[j] : (float)IV(got)[j];
                int ok = rel > 0 ? fabs((double)g - w) <= rel * (1 + fabs((double)w)) : memcmp(&g, &w, 4) == 0;
                if (!ok) {
                    cr_expect_fail("%s %s: out %d [%lld]: got %.9g, want %.9g", what, dname(dt), i, (long long)j, g, w);
                    return 0;
                }
                continue;
            }
            uint16_t gh = H(got)[j], wh = to16(dt, w);
            float g = from16(dt, gh), wr = from16(dt, wh);
            int ok = rel > 0 ? fabs((double)g - w) <= rel * (1 + fabs((double)w)) : ulps16(gh, wh) <= ulps;
            if (!ok || isnan(g) != isnan(w)) {
                cr_expect_fail("%s %s: out %d [%lld]: got %.9g (0x%04x), want %.9g rounded to %.9g (0x%04x)", what, dname(dt),
                               i, (long long)j, g, gh, w, wr, wh);
                return 0;
            }
        }
    }
    return 1;
}

typedef Case (*Make)(void);

/* The case made fresh for each dtype, run in f32 and in 16 bits, compared. */
static void check(Make make, int ulps, double rel_f16, double rel_bf16, const char *what)
{
    int dts[2] = {KT_F16, KT_BF16};
    for (int d = 0; d < 2; d++) {
        int dt = dts[d];
        Case c = make();
        round_inputs(&c, dt);
        KCall l = lowp_twin(&c, dt, 0);
        l.work_floats = exec_work(c.f, &l);
        l.work = l.work_floats ? track(l.work_floats * sizeof(float)) : NULL;
        c.f(&c.k);
        c.f(&l);
        compare(&c, &l, dt, ulps, dt == KT_F16 ? rel_f16 : rel_bf16, what);
    }
}

#define EXACT(make) check(make, 0, 0, 0, #make)

/* ---- conversions ------------------------------------------------------------------- */

Test(lowp, conversions_round_trip_every_16_bit_value)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = cpu_f16_to_f32((uint16_t)h), b = cpu_bf16_to_f32((uint16_t)h);
        if (!isnan(f)) cr_assert_eq(cpu_f32_to_f16(f), h, "f16 0x%04x", h);
        if (!isnan(b)) cr_assert_eq(cpu_f32_to_bf16(b), h, "bf16 0x%04x", h);
    }
    /* Ties go to even; the smallest subnormals; overflow. */
    cr_expect_eq(cpu_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    cr_expect_eq(cpu_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-23f), 0x3f81);
    cr_expect_eq(cpu_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    cr_expect_eq(cpu_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    cr_expect_eq(cpu_f32_to_f16(0x1p-25f), 0x0000);
    cr_expect_eq(cpu_f32_to_f16(0x1.000002p-25f), 0x0001);
    cr_expect_eq(cpu_f32_to_f16(3 * 0x1p-25f), 0x0002);
    cr_expect_eq(cpu_f32_to_f16(65520.0f), 0x7c00);
    cr_expect_eq(cpu_f32_to_f16(-65519.0f), 0xfbff);
}

static Case mk_cast_to(void)
{
    KTensor x = frand(S(70000), -70000, 70000);
    for (int i = 0; i < 100; i++) F(&x)[i] = ldexpf(urand(-1, 1), -(int)(urand(0, 30)));  // subnormals too
    return (Case){.f = cpu_cast, .k = call(1, &x, 1, (KTensor[]){like(&x)}), .keep = KEEP_IN(0)};
}

static Case mk_cast_from(void)
{
    KTensor x = frand(S(70000), -3, 3);
    return (Case){.f = cpu_cast, .k = call(1, &x, 1, (KTensor[]){like(&x)}), .keep = KEEP_OUT(0)};
}

Test(lowp, cast)
{
    EXACT(mk_cast_to);
    EXACT(mk_cast_from);
    /* f16 -> bf16: one rounding of the f16 value. */
    KTensor x = ten(KT_F16, S(65536)), y = ten(KT_BF16, S(65536));
    for (uint32_t h = 0; h < 65536; h++) H(&x)[h] = (uint16_t)h;
    KCall k = call(1, &x, 1, &y);
    cpu_cast(&k);
    for (uint32_t h = 0; h < 65536; h++) {
        float f = cpu_f16_to_f32((uint16_t)h);
        if (!isnan(f)) cr_assert_eq(H(&y)[h], cpu_f32_to_bf16(f), "0x%04x", h);
    }
}

/* ---- pointwise --------------------------------------------------------------------- */

static CpuKernel binop;
static int64_t bshape_a[3], bshape_b[3], bshape_o[3];
static int bra, brb, bro;

static Case mk_binary(void)
{
    KTensor a = frand(bra, bshape_a, -3, 3), b = frand(brb, bshape_b, -3, 3);
    if (binop == cpu_div)
        for (int64_t i = 0; i < b.numel; i++) F(&b)[i] = F(&b)[i] < 0 ? F(&b)[i] - 0.5f : F(&b)[i] + 0.5f;
    return (Case){.f = binop, .k = call(2, (KTensor[]){a, b}, 1, (KTensor[]){ten(KT_F32, bro, bshape_o)})};
}

static void set_shapes(int ra, const int64_t *a, int rb, const int64_t *b, int ro, const int64_t *o)
{
    bra = ra, brb = rb, bro = ro;
    memcpy(bshape_a, a, sizeof(int64_t) * (size_t)ra);
    memcpy(bshape_b, b, sizeof(int64_t) * (size_t)rb);
    memcpy(bshape_o, o, sizeof(int64_t) * (size_t)ro);
}

Test(lowp, binary_ops_and_unary_backward_exact)
{
    CpuKernel ops[] = {cpu_add, cpu_sub, cpu_mul, cpu_div, cpu_relu_bwd, cpu_gelu_bwd, cpu_silu_bwd,
                       cpu_tanh_bwd, cpu_sigmoid_bwd, cpu_sqrt_bwd, cpu_rsqrt_bwd};
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        binop = ops[i];
        set_shapes(S(300, 130), S(300, 130), S(300, 130));  // parallel, same shape
        EXACT(mk_binary);
        if (i >= 4) continue;  // the backward ops take equal shapes
        set_shapes(S(64, 33), S(33), S(64, 33));  // row broadcast
        EXACT(mk_binary);
        set_shapes(S(4, 1, 5), S(3, 1), S(4, 3, 5));  // both broadcast
        EXACT(mk_binary);
        set_shapes(S(1), S(7, 9), S(7, 9));  // scalar-like a
        EXACT(mk_binary);
    }
}

static CpuKernel unop;
static float ulo, uhi;

static Case mk_unary(void)
{
    KTensor x = frand(S(200, 190), ulo, uhi);
    return (Case){.f = unop, .k = call(1, &x, 1, (KTensor[]){like(&x)})};
}

Test(lowp, unary_ops_exact)
{
    struct {
        CpuKernel f;
        float lo, hi;
    } ops[] = {{cpu_neg, -3, 3},  {cpu_exp, -8, 8},     {cpu_log, 0.01f, 50}, {cpu_sqrt, 0, 50},
               {cpu_rsqrt, 0.01f, 50}, {cpu_tanh, -4, 4}, {cpu_sigmoid, -9, 9}, {cpu_relu, -3, 3},
               {cpu_gelu, -5, 5}, {cpu_silu, -5, 5}};
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        unop = ops[i].f, ulo = ops[i].lo, uhi = ops[i].hi;
        EXACT(mk_unary);
    }
}

static Case mk_expand(void)
{
    KTensor x = frand(S(3, 1, 5), -3, 3);
    Case c = {.f = cpu_expand, .k = call(1, &x, 1, (KTensor[]){ten(KT_F32, S(2, 3, 4, 5))})};
    return c;
}

static Case mk_full(void)
{
    Case c = {.f = cpu_full, .k = call(0, NULL, 1, (KTensor[]){ten(KT_F32, S(5, 7))})};
    c.k.attr[0] = 0.1;
    return c;
}

Test(lowp, expand_and_full_exact)
{
    EXACT(mk_expand);
    EXACT(mk_full);
}

/* ---- layout ------------------------------------------------------------------------ */

static Case mk_transpose(void)
{
    KTensor x = frand(S(3, 70, 45), -3, 3);
    Case c = {.f = cpu_transpose, .k = call(1, &x, 1, (KTensor[]){ten(KT_F32, S(3, 45, 70))})};
    c.k.attr[1] = -2, c.k.attr[2] = -1;
    return c;
}

static const int64_t perm[] = {2, 0, 1};

static Case mk_permute(void)
{
    KTensor x = frand(S(4, 5, 6), -3, 3);
    Case c = {.f = cpu_permute, .k = call(1, &x, 1, (KTensor[]){ten(KT_F32, S(6, 4, 5))})};
    c.k.ints = perm, c.k.n_ints = 3;
    return c;
}

static Case mk_heads(void)
{
    KTensor x = frand(S(2, 9, 12), -3, 3);
    Case c = {.f = cpu_heads, .k = call(1, &x, 1, (KTensor[]){ten(KT_F32, S(2, 3, 9, 4))})};
    c.k.attr[1] = 3;
    return c;
}

static Case mk_merge_heads(void)
{
    KTensor x = frand(S(2, 3, 9, 4), -3, 3);
    return (Case){.f = cpu_merge_heads, .k = call(1, &x, 1, (KTensor[]){ten(KT_F32, S(2, 9, 12))})};
}

static Case mk_split(void)
{
    KTensor x = frand(S(4, 9), -3, 3);
    return (Case){.f = cpu_split, .k = call(1, &x, 3, (KTensor[]){ten(KT_F32, S(4, 3)), ten(KT_F32, S(4, 3)), ten(KT_F32, S(4, 3))})};
}

static Case mk_concat(void)
{
    KTensor a = frand(S(4, 2), -3, 3), b = frand(S(4, 5), -3, 3);
    return (Case){.f = cpu_concat, .k = call(2, (KTensor[]){a, b}, 1, (KTensor[]){ten(KT_F32, S(4, 7))})};
}

static Case mk_slice(void)
{
    KTensor x = frand(S(4, 9, 3), -3, 3);
    Case c = {.f = cpu_slice, .k = call(1, &x, 1, (KTensor[]){ten(KT_F32, S(4, 5, 3))})};
    c.k.attr[1] = 1, c.k.attr[2] = 2, c.k.attr[3] = 5;
    return c;
}

static Case mk_slice_bwd(void)
{
    KTensor dy = frand(S(4, 5, 3), -3, 3);
    Case c = {.f = cpu_slice_bwd, .k = call(1, &dy, 1, (KTensor[]){ten(KT_F32, S(4, 9, 3))})};
    c.k.attr[1] = 1, c.k.attr[2] = 2, c.k.attr[3] = 9;
    return c;
}

static Case mk_reshape(void)
{
    KTensor x = frand(S(4, 9), -3, 3);
    return (Case){.f = cpu_reshape, .k = call(1, &x, 1, (KTensor[]){ten(KT_F32, S(36))})};
}

static Case mk_copy(void)
{
    KTensor x = frand(S(40), -3, 3);
    return (Case){.f = cpu_copy, .k = call(1, &x, 1, (KTensor[]){like(&x)})};
}

Test(lowp, layout_ops_exact)
{
    EXACT(mk_transpose);
    EXACT(mk_permute);
    EXACT(mk_heads);
    EXACT(mk_merge_heads);
    EXACT(mk_split);
    EXACT(mk_concat);
    EXACT(mk_slice);
    EXACT(mk_slice_bwd);
    EXACT(mk_reshape);
    EXACT(mk_copy);
}

/* ---- reductions ------------------------------------------------------------------- */

static CpuKernel redop;
static int64_t rshape[4], oshape[4];
static int rrank, orank, raxis;

static Case mk_reduce(void)
{
    KTensor x = frand(rrank, rshape, -3, 3);
    Case c = {.f = redop, .k = call(1, &x, 1, (KTensor[]){ten(KT_F32, orank, oshape)})};
    c.k.attr[1] = raxis;
    return c;
}

static void set_reduce(CpuKernel f, int rx, const int64_t *xs, int ro, const int64_t *os, int axis)
{
    redop = f, rrank = rx, orank = ro, raxis = axis;
    memcpy(rshape, xs, sizeof(int64_t) * (size_t)rx);
    memcpy(oshape, os, sizeof(int64_t) * (size_t)ro);
}

Test(lowp, sum_mean_max_softmax_exact)
{
    CpuKernel red[] = {cpu_sum, cpu_mean, cpu_max};
    for (int i = 0; i < 3; i++) {
        set_reduce(red[i], S(50, 700), S(50), -1);  // innermost reduced
        EXACT(mk_reduce);
        set_reduce(red[i], S(700, 50), S(50), 0);  // innermost kept
        EXACT(mk_reduce);
        set_reduce(red[i], S(6, 300, 40), S(6, 1, 40), 1);  // middle, keepdim
        EXACT(mk_reduce);
        set_reduce(red[i], S(37), S(1), 0);
        EXACT(mk_reduce);
    }
    set_reduce(cpu_softmax, S(40, 1000), S(40, 1000), -1);
    EXACT(mk_reduce);
    set_reduce(cpu_softmax, S(5, 30, 300), S(5, 30, 300), 1);
    EXACT(mk_reduce);
    set_reduce(cpu_softmax, S(30, 7), S(30, 7), 0);
    EXACT(mk_reduce);
}

static Case mk_sum_to(void)
{
    KTensor x = frand(S(8, 5, 300), -3, 3);
    return (Case){.f = cpu_sum_to, .k = call(1, &x, 1, (KTensor[]){ten(KT_F32, S(5, 1))})};
}

static Case mk_sum_to_rows(void)
{
    KTensor x = frand(S(64, 700), -3, 3);
    return (Case){.f = cpu_sum_to, .k = call(1, &x, 1, (KTensor[]){ten(KT_F32, S(700))})};
}

static Case mk_sumsq_parts(void)
{
    KTensor x = frand(S(100000), -3, 3);
    int64_t parts = (100000 + OPS_SUMSQ_CHUNK - 1) / OPS_SUMSQ_CHUNK;
    return (Case){.f = cpu_sumsq_parts, .k = call(1, &x, 1, (KTensor[]){ten(KT_F32, S(parts))}), .keep = KEEP_OUT(0)};
}

static Case mk_max_bwd(void)
{
    KTensor x = frand(S(6, 50, 40), -3, 3), dy = frand(S(6, 40), -1, 1);
    Case c = {.f = cpu_max_bwd, .k = call(2, (KTensor[]){x, dy}, 1, (KTensor[]){like(&x)})};
    c.k.attr[2] = 1;
    return c;
}

static int64_t smshape[3];
static int smrank, smaxis;

static Case mk_softmax_bwd(void)
{
    KTensor y = frand(smrank, smshape, 0, 1), dy = frand(smrank, smshape, -1, 1);
    Case c = {.f = cpu_softmax_bwd, .k = call(2, (KTensor[]){y, dy}, 1, (KTensor[]){like(&y)})};
    c.k.attr[2] = smaxis;
    return c;
}

Test(lowp, sum_to_sumsq_parts_and_backward_reductions_exact)
{
    EXACT(mk_sum_to);
    EXACT(mk_sum_to_rows);
    EXACT(mk_sumsq_parts);
    EXACT(mk_max_bwd);
    smrank = 2, smshape[0] = 40, smshape[1] = 900, smaxis = -1;
    EXACT(mk_softmax_bwd);
    smrank = 3, smshape[0] = 3, smshape[1] = 20, smshape[2] = 300, smaxis = 1;
    EXACT(mk_softmax_bwd);
}

/* ---- norms ------------------------------------------------------------------------- */

static int norm_rms;

static Case mk_norm(void)
{
    KTensor x = frand(S(4, 30, 768), -3, 3), w = frand(S(768), 0.5f, 1.5f), b = frand(S(768), -1, 1);
    Case c = norm_rms ? (Case){.f = cpu_rmsnorm, .k = call(2, (KTensor[]){x, w}, 1, (KTensor[]){like(&x)})}
                      : (Case){.f = cpu_layernorm, .k = call(3, (KTensor[]){x, w, b}, 1, (KTensor[]){like(&x)})};
    c.k.attr[norm_rms ? 2 : 3] = 1e-5;
    return c;
}

static Case mk_norm_bwd(void)
{
    KTensor x = frand(S(4, 30, 768), -3, 3), w = frand(S(768), 0.5f, 1.5f), dy = frand(S(4, 30, 768), -1, 1);
    Case c = norm_rms ? (Case){.f = cpu_rmsnorm_bwd,
                               .k = call(3, (KTensor[]){x, w, dy}, 2, (KTensor[]){like(&x), like(&w)})}
                      : (Case){.f = cpu_layernorm_bwd,
                               .k = call(3, (KTensor[]){x, w, dy}, 3, (KTensor[]){like(&x), like(&w), like(&w)})};
    c.k.attr[3] = 1e-5;
    return c;
}

/* The _add forms (passes/epilogue.c): r added to dx before the one rounding. */
static Case mk_norm_bwd_add(void)
{
    Case c = mk_norm_bwd();
    c.f = norm_rms ? cpu_rmsnorm_bwd_add : cpu_layernorm_bwd_add;
    c.k.in[3] = frand(S(4, 30, 768), -2, 2), c.k.n_in = 4;
    c.k.attr[3] = 0, c.k.attr[4] = 1e-5;
    return c;
}

Test(lowp, norms_and_backward_exact)
{
    for (norm_rms = 0; norm_rms < 2; norm_rms++) {
        EXACT(mk_norm);
        EXACT(mk_norm_bwd);
        EXACT(mk_norm_bwd_add);
    }
}

/* ---- lookups and the loss ---------------------------------------------------------- */

static Case mk_embedding(void)
{
    KTensor t = frand(S(50, 24), -3, 3), idx = irand(S(4, 9), 50);
    return (Case){.f = cpu_embedding, .k = call(2, (KTensor[]){t, idx}, 1, (KTensor[]){ten(KT_F32, S(4, 9, 24))})};
}

static Case mk_embedding_bwd(void)
{
    KTensor idx = irand(S(8, 300), 60), dy = frand(S(8, 300, 130), -1, 1);  // many repeats
    Case c = {.f = cpu_embedding_bwd, .k = call(2, (KTensor[]){idx, dy}, 1, (KTensor[]){ten(KT_F32, S(60, 130))})};
    c.k.attr[2] = 60;
    return c;
}

static Case mk_cross_entropy(void)
{
    KTensor x = frand(S(6, 50, 1000), -6, 6), tg = irand(S(6, 50), 1000);
    return (Case){.f = cpu_cross_entropy,
                  .k = call(2, (KTensor[]){x, tg}, 2, (KTensor[]){fscalar(0), ten(KT_F32, S(6, 50, 2))}),
                  .keep = KEEP_OUT(0) | KEEP_OUT(1)};
}

static Case mk_cross_entropy_bwd(void)
{
    KTensor x = frand(S(6, 50, 1000), -6, 6), tg = irand(S(6, 50), 1000);
    return (Case){.f = cpu_cross_entropy_bwd, .k = call(3, (KTensor[]){x, tg, fscalar(1.5f)}, 1, (KTensor[]){like(&x)}),
                  .keep = KEEP_IN(2)};
}

Test(lowp, embedding_and_loss_exact)
{
    EXACT(mk_embedding);
    EXACT(mk_embedding_bwd);
    EXACT(mk_cross_entropy);
    EXACT(mk_cross_entropy_bwd);
}

/* ---- rope, attention, matmul ----------------------------------------------------- */

static Case mk_rope(void)
{
    KTensor x = frand(S(2, 3, 40, 64), -3, 3);
    Case c = {.f = cpu_rope, .k = call(1, &x, 1, (KTensor[]){like(&x)})};
    c.k.attr[1] = 10000;
    return c;
}

static int att_causal, att_kv = 3;  // att_kv: kv heads of the 3 query heads (1: multi-query)

static Case mk_attention(void)
{
    KTensor q = frand(S(2, 3, 150, 32), -1, 1), k = frand(S(2, att_kv, 150, 32), -1, 1), v = frand(S(2, att_kv, 150, 32), -1, 1);
    Case c = {.f = cpu_attention,
              .k = call(3, (KTensor[]){q, k, v}, 2, (KTensor[]){like(&q), ten(KT_F32, S(2, 3, 150))}),
              .keep = KEEP_OUT(1)};
    c.k.attr[3] = att_causal;
    return c;
}

/* o and lse from the f32 forward on the rounded q, k, v, as a 16-bit plan would have them. */
static Case mk_attention_bwd(void)
{
    KTensor q = frand(S(2, 3, 150, 32), -1, 1), k = frand(S(2, att_kv, 150, 32), -1, 1), v = frand(S(2, att_kv, 150, 32), -1, 1);
    KTensor o = like(&q), lse = ten(KT_F32, S(2, 3, 150)), dout = frand(S(2, 3, 150, 32), -1, 1);
    KCall f = call(3, (KTensor[]){q, k, v}, 2, (KTensor[]){o, lse});
    f.attr[3] = att_causal;
    cpu_attention(&f);
    Case c = {.f = cpu_attention_bwd,
              .k = call(6, (KTensor[]){q, k, v, o, lse, dout}, 3, (KTensor[]){like(&q), like(&k), like(&v)}),
              .keep = KEEP_IN(4)};
    c.k.attr[6] = att_causal;
    return c;
}

Test(lowp, rope_exact_and_attention_close)
{
    EXACT(mk_rope);
    for (att_kv = 3; att_kv > 0; att_kv -= 2)
        for (att_causal = 0; att_causal < 2; att_causal++) {
            check(mk_attention, 0, 1e-3, 1e-2, "attention");
            check(mk_attention_bwd, 0, 1e-3, 1e-2, "attention_bwd");
        }
}

static int64_t ma[4], mb[4], mo[4];
static int mra, mrb, mro, mta, mtb;

static Case mk_matmul(void)
{
    KTensor a = frand(mra, ma, -1, 1), b = frand(mrb, mb, -1, 1);
    Case c = {.f = cpu_matmul, .k = call(2, (KTensor[]){a, b}, 1, (KTensor[]){ten(KT_F32, mro, mo)})};
    c.k.attr[2] = mta, c.k.attr[3] = mtb;
    return c;
}

static void set_matmul(int ra, const int64_t *a, int rb, const int64_t *b, int ro, const int64_t *o, int ta, int tb)
{
    mra = ra, mrb = rb, mro = ro, mta = ta, mtb = tb;
    memcpy(ma, a, sizeof(int64_t) * (size_t)ra);
    memcpy(mb, b, sizeof(int64_t) * (size_t)rb);
    memcpy(mo, o, sizeof(int64_t) * (size_t)ro);
}

static void matmul_cases(void (*run)(void))
{
    set_matmul(S(3, 70, 200), S(200, 90), S(3, 70, 90), 0, 0);  // linear layer: batch folds into M
    run();
    set_matmul(S(200, 70), S(90, 200), S(70, 90), 1, 1);  // both transposed
    run();
    set_matmul(S(4, 33, 65), S(4, 65, 17), S(4, 33, 17), 0, 0);  // batched, small GEMMs in parallel
    run();
    set_matmul(S(2, 1, 40, 50), S(3, 30, 50), S(2, 3, 40, 30), 0, 1);  // batch broadcast, tb
    run();
    set_matmul(S(2, 60, 40), S(2, 60, 50), S(2, 40, 50), 1, 0);  // batched ta: no fold
    run();
    set_matmul(S(77), S(77, 19), S(19), 0, 0);  // vector @ matrix
    run();
    set_matmul(S(23, 77), S(77), S(23), 0, 0);  // matrix @ vector
    run();
}

static void matmul_close(void) { check(mk_matmul, 0, 1e-3, 1e-2, "matmul"); }

Test(lowp, matmul_close)
{
    matmul_cases(matmul_close);
}

/* ---- a small workspace: every kernel in pieces, the same bits ---------------------- */

static size_t small_work;

/* The 16-bit call with the executor's workspace and with small_work floats (each at
 * least the call's least need) give the same bits, or for matmul stay close. */
static void pieces(Make make, double rel, const char *what)
{
    int dts[2] = {KT_F16, KT_BF16};
    for (int d = 0; d < 2; d++) {
        int dt = dts[d];
        Case c = make();
        round_inputs(&c, dt);
        KCall big = lowp_twin(&c, dt, 0), small;
        big.work_floats = exec_work(c.f, &big);
        big.work = track(big.work_floats * sizeof(float));
        small = big;
        CpuWork w = cpu_work(c.f, &big);
        small.work_floats = w.least > small_work ? w.least : small_work;
        cr_assert(small.work_floats < w.all, "%s: %zu floats do not cut the call (all %zu)", what, small.work_floats, w.all);
        small.work = track(small.work_floats * sizeof(float));
        for (int i = 0; i < small.n_out; i++) small.out[i] = like(&big.out[i]);
        c.f(&c.k);
        c.f(&big);
        c.f(&small);
        compare(&c, &small, dt, 0, rel > 0 ? rel * (dt == KT_BF16 ? 10 : 1) : 0, what);
        for (int i = 0; i < small.n_out && rel == 0; i++)
            cr_expect(!memcmp(big.out[i].data, small.out[i].data, (size_t)(big.out[i].numel * esz(big.out[i].dtype))),
                      "%s %s: out %d differs between workspaces", what, dname(dt), i);
    }
}

static void matmul_pieces(void) { pieces(mk_matmul, 1e-3, "matmul"); }

Test(lowp, small_workspace_same_results)
{
    small_work = 1;  // the least each call needs: one slab, row or panel at a time
    pieces(mk_norm, 0, "layernorm");
    pieces(mk_norm_bwd, 0, "layernorm_bwd");
    pieces(mk_norm_bwd_add, 0, "layernorm_bwd_add");
    norm_rms = 1;
    pieces(mk_norm_bwd, 0, "rmsnorm_bwd");
    set_reduce(cpu_softmax, S(40, 1000), S(40, 1000), -1);
    pieces(mk_reduce, 0, "softmax");
    set_reduce(cpu_max, S(6, 300, 40), S(6, 1, 40), 1);
    pieces(mk_reduce, 0, "max");
    pieces(mk_max_bwd, 0, "max_bwd");
    smrank = 3, smshape[0] = 3, smshape[1] = 20, smshape[2] = 300, smaxis = 1;
    pieces(mk_softmax_bwd, 0, "softmax_bwd");
    pieces(mk_embedding_bwd, 0, "embedding_bwd");
    pieces(mk_rope, 0, "rope");
    att_causal = 1;
    pieces(mk_attention, 0, "attention");
    pieces(mk_attention_bwd, 0, "attention_bwd");
    matmul_cases(matmul_pieces);  // panels of at most 16 rows and 16 columns
}

/* ---- 1 and 2 threads: the same bits ----------------------------------------------
 * OpenMP's thread count, as in test_cpu_kernels.c. OpenBLAS's own thread count stays
 * fixed: cblas_sgemm itself (0.3.21, f32 operands alike) gives other bits for a large
 * GEMM when OpenBLAS runs it on another number of threads. */

static void threads(int n) { omp_set_num_threads(n); }

static void same_at_1_and_2_threads(Make make, const char *what)
{
    int dts[2] = {KT_F16, KT_BF16};
    for (int d = 0; d < 2; d++) {
        Case c = make();
        round_inputs(&c, dts[d]);
        KCall a = lowp_twin(&c, dts[d], 0), b;
        a.work_floats = exec_work(c.f, &a);
        a.work = track(a.work_floats * sizeof(float));
        b = a;
        for (int i = 0; i < b.n_out; i++) b.out[i] = like(&a.out[i]);
        threads(1);
        c.f(&a);
        threads(2);
        c.f(&b);
        for (int i = 0; i < a.n_out; i++)
            cr_expect(!memcmp(a.out[i].data, b.out[i].data, (size_t)(a.out[i].numel * esz(a.out[i].dtype))),
                      "%s %s: out %d differs between 1 and 2 threads", what, dname(dts[d]), i);
    }
}

static void matmul_threads(void) { same_at_1_and_2_threads(mk_matmul, "matmul"); }

Test(lowp, same_bits_at_1_and_2_threads)
{
    binop = cpu_gelu_bwd;
    set_shapes(S(300, 130), S(300, 130), S(300, 130));
    same_at_1_and_2_threads(mk_binary, "gelu_bwd");
    unop = cpu_exp, ulo = -3, uhi = 3;
    same_at_1_and_2_threads(mk_unary, "exp");
    same_at_1_and_2_threads(mk_sum_to_rows, "sum_to");
    same_at_1_and_2_threads(mk_sumsq_parts, "sumsq_parts");
    set_reduce(cpu_softmax, S(40, 1000), S(40, 1000), -1);
    same_at_1_and_2_threads(mk_reduce, "softmax");
    norm_rms = 0;
    same_at_1_and_2_threads(mk_norm, "layernorm");
    same_at_1_and_2_threads(mk_norm_bwd, "layernorm_bwd");
    same_at_1_and_2_threads(mk_embedding_bwd, "embedding_bwd");
    same_at_1_and_2_threads(mk_cross_entropy, "cross_entropy");
    same_at_1_and_2_threads(mk_cross_entropy_bwd, "cross_entropy_bwd");
    att_causal = 1;
    same_at_1_and_2_threads(mk_attention, "attention");
    same_at_1_and_2_threads(mk_attention_bwd, "attention_bwd");
    matmul_cases(matmul_threads);
    set_matmul(S(600, 500), S(500, 400), S(600, 400), 0, 0);  // big enough for OpenBLAS's threads
    matmul_threads();
}

/* ---- the workspace needs --------------------------------------------------------- */

Test(lowp, f32_calls_need_no_workspace)
{
    set_matmul(S(3, 70, 200), S(200, 90), S(3, 70, 90), 0, 0);
    Case c = mk_matmul();
    CpuWork w = cpu_work(cpu_matmul, &c.k);
    cr_expect(w.least == 0 && w.all == 0);
    KCall l = lowp_twin(&c, KT_BF16, 0);
    w = cpu_work(cpu_matmul, &l);
    cr_expect_eq(w.all, (size_t)(210 * 200 + 200 * 90 + 210 * 90), "the folded GEMM's operands and C");
    cr_expect(w.least > 0 && w.least < w.all);
    cr_expect_eq(cpu_work(cpu_add, &l).all, 0, "pointwise ops need none");
}
