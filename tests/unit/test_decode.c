/* tests/unit/test_decode.c: the decode program (passes/decode.c) and its two ops.
 *  - attention_decode, run position after position over caches it fills itself, gives
 *    at each position p the row p of causal attention over the whole sequence (values,
 *    against the CPU's attention kernel and a naive double reference), with NKV < NH
 *    (grouped-query) and NKV = 1 too, and several rows at once at an offset; the caches
 *    hold k and v; a position past the cache is refused by the shape of the call.
 *  - rope_at(x row, pos) is rope's row at pos, bitwise.
 *  - passes_decode on GPT-2 and Llama (GQA, rope): one attention_decode and two caches
 *    per layer, no attention, rope or arange left, a position input; the memory plan's
 *    kv cache category is 2 * L * NKV * T * head_dim * 4 bytes, every cache live for the
 *    whole program.
 *  - Models that cannot decode say why: a non-causal attention, a param added along the
 *    positions, a reshape that hard-codes T.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "frontend.h"
#include "kernels.h"
#include "passes.h"
#include "rand.h"
#include "tensors.h"
#include "report.h"
#include "sample.h"

/* ---- tensors --------------------------------------------------------------------------- */

TestSuite(decode, .fini = tensors_free);


/* Uniform in [-1, 1) (f32), or 0x7fc00000 words (NaN) when !fill. */
static KTensor ten(int dtype, int fill, int rank, const int64_t *shape)
{
    KTensor t = {.dtype = dtype, .rank = rank, .numel = 1};
    for (int d = 0; d < rank; d++) t.shape[d] = shape[d], t.numel *= shape[d];
    float *p = track((size_t)t.numel * 4);
    for (int64_t i = 0; i < t.numel; i++) p[i] = fill ? urand(-1, 1) : NAN;
    t.data = p;
    return t;
}

static float *F(const KTensor *t) { return (float *)t->data; }

/* Rows [r0, r0 + n) of the (T, X) slices of t [BH, T, X], as a tensor [BH, n, X]. */
static KTensor rows(const KTensor *t, int64_t r0, int64_t n)
{
    int r = t->rank;
    int64_t T = t->shape[r - 2], X = t->shape[r - 1], BH = t->numel / (T * X);
    int64_t shape[8];
    memcpy(shape, t->shape, sizeof *shape * (size_t)r);
    shape[r - 2] = n;
    KTensor o = ten(KT_F32, 0, r, shape);
    for (int64_t b = 0; b < BH; b++) memcpy(F(&o) + b * n * X, F(t) + (b * T + r0) * X, sizeof(float) * (size_t)(n * X));
    return o;
}

/* Causal attention of row i of slice b in double: query slice b reads kv slice b / G. */
static double ref_at(const KTensor *q, const KTensor *k, const KTensor *v, int64_t b, int64_t i, int64_t c)
{
    int r = q->rank;
    int64_t T = q->shape[r - 2], D = q->shape[r - 1], Dv = v->shape[r - 1];
    int64_t G = q->numel / (T * D) / (k->numel / (T * D)), kb = b / G;
    double m = -INFINITY, z = 0, o = 0, s[512];
    for (int64_t j = 0; j <= i; j++) {
        s[j] = 0;
        for (int64_t d = 0; d < D; d++) s[j] += (double)F(q)[(b * T + i) * D + d] * F(k)[(kb * T + j) * D + d];
        s[j] /= sqrt((double)D), m = s[j] > m ? s[j] : m;
    }
    for (int64_t j = 0; j <= i; j++) z += exp(s[j] - m), o += exp(s[j] - m) * F(v)[(kb * T + j) * Dv + c];
    return o / z;
}

static void expect_close(const float *got, const float *want, int64_t n, double tol, const char *what, int64_t p)
{
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= tol * (1 + fabs((double)want[i])))) {
            cr_expect_fail("%s, position %lld, [%lld]: got %.7g, want %.7g", what, (long long)p, (long long)i,
                           (double)got[i], (double)want[i]);
            return;
        }
}

/* q [B, H, T, D], k and v [B, HKV, T, D|Dv]: causal attention's rows, and attention_decode
 * called on `step` rows at a time from position 0 on, over caches of T rows. */
static void check_decode(int64_t B, int64_t H, int64_t HKV, int64_t T, int64_t D, int64_t Dv, int64_t step)
{
    KTensor q = ten(KT_F32, 1, S(B, H, T, D)), k = ten(KT_F32, 1, S(B, HKV, T, D)), v = ten(KT_F32, 1, S(B, HKV, T, Dv));
    KTensor o = ten(KT_F32, 0, S(B, H, T, Dv)), lse = ten(KT_F32, 0, S(B, H, T));
    KCall full = {.n_in = 3, .in = {q, k, v}, .n_out = 2, .out = {o, lse}, .attr = {0, 0, 0, 1}};
    cpu_attention(&full);
    KTensor kc = ten(KT_F32, 0, S(B, HKV, T, D)), vc = ten(KT_F32, 0, S(B, HKV, T, Dv));
    int32_t at = 0;
    KTensor pos = {.dtype = KT_I32, .rank = 1, .shape = {1}, .numel = 1, .data = &at};
    for (int64_t p = 0; p < T; p += step) {
        int64_t n = p + step <= T ? step : T - p;
        at = (int32_t)p;
        KTensor qp = rows(&q, p, n), kp = rows(&k, p, n), vp = rows(&v, p, n), want = rows(&o, p, n);
        KTensor got = ten(KT_F32, 0, S(B, H, n, Dv));
        KCall c = {.n_in = 6, .in = {qp, kp, vp, kc, vc, pos}, .n_out = 1, .out = {got}};
        cpu_attention_decode(&c);
        expect_close(F(&got), F(&want), got.numel, 2e-5, "attention_decode against attention's rows", p);
        float ref[4096];
        cr_assert(got.numel <= 4096);
        for (int64_t b = 0; b < B * H; b++)
            for (int64_t i = 0; i < n; i++)
                for (int64_t cc = 0; cc < Dv; cc++) ref[(b * n + i) * Dv + cc] = (float)ref_at(&q, &k, &v, b, p + i, cc);
        expect_close(F(&got), ref, got.numel, 2e-5, "attention_decode against the double reference", p);
    }
    cr_expect(!memcmp(F(&kc), F(&k), sizeof(float) * (size_t)k.numel), "the k cache holds k");
    cr_expect(!memcmp(F(&vc), F(&v), sizeof(float) * (size_t)v.numel), "the v cache holds v");
}

Test(decode, attention_decode_is_causal_attention_row_by_row)
{
    check_decode(1, 2, 2, 9, 4, 4, 1);      // multi-head
    check_decode(2, 4, 2, 7, 8, 6, 1);      // grouped-query: 4 query heads over 2 kv heads, Dv != D
    check_decode(1, 4, 1, 70, 16, 16, 1);   // multi-query, past a tile of 64 keys
    check_decode(1, 6, 3, 20, 8, 8, 3);     // three rows at a time, at positions 0, 3, 6, ...
}

Test(decode, rope_at_is_ropes_row)
{
    KTensor x = ten(KT_F32, 1, S(2, 3, 11, 8)), y = ten(KT_F32, 0, S(2, 3, 11, 8));
    KCall r = {.n_in = 1, .in = {x}, .n_out = 1, .out = {y}, .attr = {0, 500, 0}};
    cpu_rope(&r);
    for (int32_t p = 0; p < 11; p += 5) {
        int32_t at = p;
        KTensor pos = {.dtype = KT_I32, .rank = 1, .shape = {1}, .numel = 1, .data = &at};
        KTensor xp = rows(&x, p, 1), want = rows(&y, p, 1), got = ten(KT_F32, 0, S(2, 3, 1, 8));
        KCall c = {.n_in = 2, .in = {xp, pos}, .n_out = 1, .out = {got}, .attr = {0, 0, 500, 0}};
        cpu_rope_at(&c);
        cr_expect(!memcmp(got.data, want.data, sizeof(float) * (size_t)got.numel), "rope_at at %d is rope's row", p);
    }
}

Test(decode, shape_rule_refuses_what_does_not_fit)
{
    ShapeCtx c = {.op = OP_attention_decode, .n_in = 6};
    char err[256];
    c.err = err, c.errlen = sizeof err;
    const OpType q = {DT_F32, 4, {1, 4, 1, 8}}, k = {DT_F32, 4, {1, 2, 1, 8}}, kc = {DT_F32, 4, {1, 2, 16, 8}};
    const OpType pos = {DT_I32, 1, {1}}, bad_kc = {DT_F32, 4, {1, 3, 16, 8}};
    OpType in[6] = {q, k, k, kc, kc, pos};
    memcpy(c.in, in, sizeof in);
    cr_assert_eq(op_shape(&c), 0, "%s", err);
    cr_expect(c.n_out == 1 && c.out[0].rank == 4 && c.out[0].shape[1] == 4 && c.out[0].shape[2] == 1 &&
              c.out[0].shape[3] == 8);
    c.in[3] = bad_kc;
    cr_expect_neq(op_shape(&c), 0);
    cr_expect(strstr(err, "does not fit its cache"), "%s", err);
    c.in[3] = kc, c.in[5] = (OpType){DT_F32, 1, {1}};
    cr_expect_neq(op_shape(&c), 0);
    cr_expect(strstr(err, "pos must be an i32 [1]"), "%s", err);
}

/* ---- the pass ---------------------------------------------------------------------------- */

/* src lowered with one sequence (B = 1), then passes_decode: the decode graph through the
 * forward passes into *plan, or NULL with the reason in why. */
static Graph *decode_of(const char *src, const Define *defs, int n_defs, Plan **plan, char *why, size_t whylen)
{
    Diag d;
    diag_init(&d, "model.fsm", src, strlen(src), stderr);
    FrontendOptions fo = {defs, n_defs, NULL, 0};
    Options o = {.verify = 1};
    Graph *g = fe_compile(src, strlen(src), &fo, &o.train, &d), *dg = NULL;
    cr_assert_not_null(g);
    int logits = -1;
    for (int n = 0; n < g->n_nodes; n++)
        if (g->nodes[n].op == OP_cross_entropy) logits = ir_in(g, &g->nodes[n], 0);
    cr_assert(logits >= 0);
    passes_eval_identity(g);
    int rc = passes_decode(g, logits, &dg, why, whylen);
    ir_graph_free(g);
    if (rc) return NULL;
    cr_assert_eq(passes_run_forward(dg, &o, &d), 0);
    char err[512];
    *plan = codegen_plan(dg, &o.train, err, sizeof err);
    cr_assert_not_null(*plan, "%s", err);
    return dg;
}

static void check_caches(const char *file, const Define *defs, int n_defs, int64_t L, int64_t NKV, int64_t T, int64_t hd)
{
    char why[600];
    Plan *p = NULL;
    Graph *g = decode_of(sample_source(file), defs, n_defs, &p, why, sizeof why);
    cr_assert_not_null(g, "%s: %s", file, why);
    int ops[OP_COUNT] = {0}, caches = 0, pos = 0;
    for (int n = 0; n < g->n_nodes; n++) ops[g->nodes[n].op]++;
    for (int v = 0; v < g->n_values; v++) {
        const Value *x = &g->values[v];
        pos += x->step_role == SR_POS;
        if (x->role != ROLE_KV_CACHE) continue;
        caches++;
        cr_expect(x->rank == 4 && x->shape[0] == 1 && x->shape[1] == NKV && x->shape[2] == T && x->shape[3] == hd,
                  "%s: cache %s", file, x->name);
    }
    cr_expect_eq(ops[OP_attention_decode], L, "%s", file);
    cr_expect_eq(ops[OP_attention] + ops[OP_rope] + ops[OP_arange] + ops[OP_cross_entropy], 0, "%s", file);
    cr_expect_eq(caches, 2 * L, "%s", file);
    cr_expect_eq(pos, 1, "%s", file);
    cr_expect_eq(g->n_outputs, 1);
    const Value *lg = &g->values[g->outputs[0]];
    cr_expect(lg->rank == 3 && lg->shape[0] == 1 && lg->shape[1] == 1, "%s: logits [1, 1, V]", file);
    char err[256];
    MemReport *r = report_mem_new(p, err, sizeof err);
    cr_assert_not_null(r, "%s", err);
    int64_t want = 2 * L * NKV * T * hd * 4, held = 0;
    cr_expect_eq(r->max_cat[PLAN_PLACE_DEVICE][MEM_KV_CACHE], want, "%s: kv cache %lld bytes, want 2 L NKV T hd 4 = %lld",
                 file, (long long)r->max_cat[PLAN_PLACE_DEVICE][MEM_KV_CACHE], (long long)want);
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (t->role != PLAN_ROLE_KV_CACHE) continue;
        held += plan_tensor_nbytes(t);
        cr_expect(t->live_start == 0 && t->live_end == p->n_ops, "%s: a cache lives the whole program", file);
    }
    cr_expect_eq(held, want);
    report_mem_free(r);
    plan_free(p);
    ir_graph_free(g);
}

Test(decode, gpt2_and_llama_decode_with_caches_of_the_formula)
{
    const Define gpt2[] = {{"L", 3}, {"C", 48}, {"NH", 4}, {"T", 24}, {"V", 256}, {"B", 1}};
    const Define llama[] = {{"L", 2}, {"C", 64}, {"NH", 8}, {"NKV", 2}, {"F", 96}, {"T", 20}, {"V", 256}, {"B", 1}};
    check_caches("gpt2.fsm", gpt2, 6, 3, 4, 24, 12);
    check_caches("llama.fsm", llama, 8, 2, 2, 20, 8);
}

/* samples/gpt2.fsm with `from` replaced by `to`: no decode program, and why says `want`. */
static void check_undecodable(const char *from, const char *to, const char *want)
{
    static char src[1 << 16];
    const char *orig = sample_source("gpt2.fsm"), *at = strstr(orig, from);
    cr_assert_not_null(at, "samples/gpt2.fsm has no '%s'", from);
    snprintf(src, sizeof src, "%.*s%s%s", (int)(at - orig), orig, to, at + strlen(from));
    const Define dims[] = {{"L", 1}, {"C", 32}, {"NH", 2}, {"T", 16}, {"V", 256}, {"B", 1}};
    char why[600] = "";
    Plan *p = NULL;
    Graph *g = decode_of(src, dims, 6, &p, why, sizeof why);
    cr_expect_null(g, "'%s' decodes", to);
    cr_expect(strstr(why, want), "'%s': why is '%s', expected '%s'", to, why, want);
    if (g) plan_free(p), ir_graph_free(g);
}

Test(decode, models_that_cannot_decode_say_why)
{
    check_undecodable("heads(v, NH), causal)", "heads(v, NH))", "not causal");
    check_undecodable("embedding(wpe, arange(T))", "wpe", "mixes the sequence's positions (add");
    check_undecodable("merge_heads(a) @ proj.w", "reshape(merge_heads(a), [1, T, C]) @ proj.w", "shape rule fails");
}
