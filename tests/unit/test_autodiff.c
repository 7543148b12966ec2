/* tests/unit/test_autodiff.c: every op's gradient, through the whole system, against
 * central finite differences.
 *
 * Each case is a tiny model whose loss is sum(Y * R): Y an expression of params, R a
 * random input, so every element of Y's gradient is distinct. It is compiled in-process
 * (frontend, passes incl. autodiff, codegen), run on the CPU backend for the analytic
 * gradients, and every param element is then nudged by +-h and the forward re-run. Ops
 * are f32, so h is large enough to drown rounding and tolerances allow O(h^2) error.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "frontend.h"
#include "passes.h"
#include "runtime.h"

typedef struct {
    const char *name;
    const char *decls;  // params and extra inputs
    const char *expr;   // Y
    const char *rshape; // R's shape, = Y's
    double h, tol;      // step and tolerance (relative to the largest gradient)
} Case;

/* Random, never-zero values for every input but R and step: integer inputs are indices
 * below `bound`. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double uniform01(void)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static Plan *compile(const char *src)
{
    Diag d;
    char *out = NULL;
    size_t outlen = 0;
    FILE *msgs = open_memstream(&out, &outlen);
    diag_init(&d, "case.fsm", src, strlen(src), msgs);
    FrontendOptions fo = {0};
    Options o = {0};
    Graph *g = fe_compile(src, strlen(src), &fo, &o.train, &d);
    int ok = g && passes_run(g, &o, &d) == 0;
    fclose(msgs);
    cr_assert(ok, "does not compile:\n%s\n%s", src, out);
    free(out);
    char err[512];
    Plan *p = codegen_plan(g, &o.train, err, sizeof err);
    ir_graph_free(g);
    cr_assert_not_null(p, "%s", err);
    return p;
}

static float loss_now(Exec *e)
{
    RtTensor t;
    cr_assert_eq(rt_exec_run(e, 1, RT_PHASE(PLAN_PHASE_FORWARD)), 0);
    rt_exec_tensor_id(e, rt_exec_plan(e)->outputs[0], &t);
    return *(float *)t.data;
}

static void fill_inputs(Exec *e, const Plan *p)
{
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *pt = &p->tensors[i];
        if (pt->role != PLAN_ROLE_INPUT || !strcmp(plan_str(p, pt->name), "step")) continue;
        RtTensor t;
        rt_exec_tensor_id(e, i, &t);
        for (int64_t k = 0; k < t.numel; k++) {
            if (t.dtype == PLAN_DT_I32)
                ((int32_t *)t.data)[k] = (int32_t)(uniform01() * 5);  // every case's index bound >= 5
            else
                ((float *)t.data)[k] = (float)(uniform01() * 2 - 1);
        }
    }
}

static void check_case(const Case *c)
{
    char src[2048];
    snprintf(src, sizeof src,
             "model t {\n  %s\n  input R: f32%s;\n  y = %s;\n  loss = sum(reshape(y * R, [-1]));\n}\n",
             c->decls, c->rshape, c->expr);
    Plan *p = compile(src);
    char err[256];
    ExecOptions eo = {.seed = 7};
    Exec *e = rt_exec_new(p, &eo, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    fill_inputs(e, p);

    /* Analytic: forward and backward of step 1. Gradients are copied out first: the
     * forward runs below reuse their buffers (they are not persistent). */
    cr_assert_eq(rt_exec_run(e, 1, RT_PHASE(PLAN_PHASE_FORWARD) | RT_PHASE(PLAN_PHASE_BACKWARD)), 0);
    float *an[64] = {0};
    for (int32_t i = 0; i < p->n_tensors && i < 64; i++) {
        const PlanTensor *pt = &p->tensors[i];
        /* The params are views of their unit's flat buffer (passes/shard.c): the model's
         * own params are checked, each through its view; the buffer is no param of the model. */
        if (pt->role != PLAN_ROLE_PARAM || (pt->alias == PLAN_NONE && pt->unit != PLAN_NONE)) continue;
        char gname[128];
        RtTensor grad;
        snprintf(gname, sizeof gname, "%s.grad", plan_str(p, pt->name));
        cr_assert_eq(rt_exec_tensor(e, gname, &grad), 0, "%s: %s has no gradient", c->name, gname);
        an[i] = malloc(sizeof(float) * (size_t)grad.numel);
        memcpy(an[i], grad.data, sizeof(float) * (size_t)grad.numel);
    }
    int checked = 0;
    for (int32_t i = 0; i < p->n_tensors && i < 64; i++) {
        if (!an[i]) continue;
        RtTensor prm;
        rt_exec_tensor_id(e, i, &prm);
        double scale = 1e-3;
        for (int64_t k = 0; k < prm.numel; k++) scale = fmax(scale, fabs(an[i][k]));
        float *x = prm.data;
        for (int64_t k = 0; k < prm.numel; k++) {
            float x0 = x[k];
            x[k] = x0 + (float)c->h;
            double lp = loss_now(e);
            x[k] = x0 - (float)c->h;
            double lm = loss_now(e);
            x[k] = x0;
            double fd = (lp - lm) / (2 * c->h);
            cr_expect(fabs(fd - an[i][k]) <= c->tol * scale, "%s: d loss / d %s[%ld]: autodiff %.6g, finite differences %.6g",
                      c->name, plan_str(p, p->tensors[i].name), (long)k, an[i][k], fd);
            checked++;
        }
        free(an[i]);
    }
    cr_assert_gt(checked, 0, "%s: no params", c->name);
    rt_exec_free(e);
    plan_free(p);
}

#define H 1e-2
#define TOL 2e-2

static Case cases[] = {
    {"matmul", "param a: [3, 4] = normal(1); param b: [4, 5] = normal(1);", "a @ b", "[3, 5]", H, TOL},
    {"matmul_batch_a", "param a: [2, 3, 4] = normal(1); param b: [4, 5] = normal(1);", "a @ b", "[2, 3, 5]", H, TOL},
    {"matmul_batch_b", "param a: [3, 4] = normal(1); param b: [2, 4, 5] = normal(1);", "a @ b", "[2, 3, 5]", H, TOL},
    {"matmul_batch_bcast", "param a: [2, 1, 3, 4] = normal(1); param b: [3, 4, 2] = normal(1);", "a @ b", "[2, 3, 3, 2]", H, TOL},
    {"matmul_vec_left", "param a: [4] = normal(1); param b: [2, 4, 5] = normal(1);", "a @ b", "[2, 5]", H, TOL},
    {"matmul_vec_right", "param a: [2, 3, 4] = normal(1); param b: [4] = normal(1);", "a @ b", "[2, 3]", H, TOL},
    {"matmul_transposed", "param a: [3, 4] = normal(1); param b: [5, 4] = normal(1);", "a @ transpose(b)", "[3, 5]", H, TOL},
    {"add_broadcast", "param a: [2, 3, 4] = normal(1); param b: [4] = normal(1);", "a + b", "[2, 3, 4]", H, TOL},
    {"sub_broadcast", "param a: [3, 1] = normal(1); param b: [1, 4] = normal(1);", "a - b", "[3, 4]", H, TOL},
    {"mul_broadcast", "param a: [2, 3, 4] = normal(1); param b: [3, 1] = normal(1);", "a * b", "[2, 3, 4]", H, TOL},
    {"div_broadcast", "param a: [2, 3] = normal(1); param b: [3] = uniform(0.5, 2);", "a / b", "[2, 3]", H, TOL},
    {"scalars", "param a: [2, 3] = normal(1);", "-a * 0.5 + 2 / (a * a + 1)", "[2, 3]", H, TOL},
    {"exp", "param a: [2, 3] = normal(0.5);", "exp(a)", "[2, 3]", H, TOL},
    {"log", "param a: [2, 3] = uniform(0.5, 2);", "log(a)", "[2, 3]", H, TOL},
    {"sqrt", "param a: [2, 3] = uniform(0.5, 2);", "sqrt(a)", "[2, 3]", H, TOL},
    {"rsqrt", "param a: [2, 3] = uniform(0.5, 2);", "rsqrt(a)", "[2, 3]", H, TOL},
    {"tanh", "param a: [2, 3] = normal(1);", "tanh(a)", "[2, 3]", H, TOL},
    {"sigmoid", "param a: [2, 3] = normal(1);", "sigmoid(a)", "[2, 3]", H, TOL},
    {"relu", "param a: [2, 3] = uniform(0.1, 1);  param b: [2, 3] = uniform(-1, -0.1);", "relu(a) + relu(b)", "[2, 3]", H, TOL},
    {"gelu", "param a: [2, 5] = normal(1.5);", "gelu(a)", "[2, 5]", H, TOL},
    {"silu", "param a: [2, 5] = normal(1.5);", "silu(a)", "[2, 5]", H, TOL},
    {"gelu_exact", "param a: [2, 5] = normal(1.5);", "gelu(a, exact)", "[2, 5]", H, TOL},
    /* x ** p: PyTorch's special exponents (2, 3, -1, 0.5, -0.5, -2) and powf's (1.5, -0.7); 0 has a zero gradient */
    {"pow", "param a: [2, 5] = normal(1); param b: [2, 5] = uniform(0.5, 2);",
     "a ** 2 + a ** 3 - 0.5 * b ** -1 + b ** 0.5 + b ** -0.5 + b ** -2 + b ** 1.5 + b ** -0.7 + b ** 0", "[2, 5]",
     H, TOL},
    /* The mask is a function of (seed, step, op, element) alone: every re-run draws it again. */
    {"dropout", "param a: [4, 8] = normal(1);", "dropout(a, 0.5) + dropout(a * a, 0.25)", "[4, 8]", H, TOL},
    {"sum_keepdim", "param a: [2, 3, 4] = normal(1);", "sum(a, axis = 1, keepdim = 1)", "[2, 1, 4]", H, TOL},
    {"sum_first", "param a: [2, 3, 4] = normal(1);", "sum(a, axis = 0)", "[3, 4]", H, TOL},
    {"mean", "param a: [2, 3, 4] = normal(1);", "mean(a, axis = -1)", "[2, 3]", H, TOL},
    {"max", "param a: [2, 3, 4] = normal(1);", "max(a, axis = 1)", "[2, 4]", 1e-3, TOL},
    {"softmax", "param a: [2, 3, 4] = normal(1);", "softmax(a)", "[2, 3, 4]", H, TOL},
    {"softmax_axis0", "param a: [3, 4] = normal(1);", "softmax(a, axis = 0)", "[3, 4]", H, TOL},
    {"layernorm", "param x: [2, 3, 8] = normal(1); param w: [8] = normal(1); param b: [8] = normal(1);",
     "layernorm(x, w, b)", "[2, 3, 8]", H, TOL},
    {"rmsnorm", "param x: [3, 8] = normal(1); param w: [8] = normal(1);", "rmsnorm(x, w)", "[3, 8]", H, TOL},
    {"embedding", "param table: [5, 4] = normal(1); input idx: i32[2, 3];", "embedding(table, idx)", "[2, 3, 4]", H, TOL},
    {"cross_entropy", "param x: [2, 3, 5] = normal(1); input t: i32[2, 3];", "cross_entropy(x, t)", "[]", H, TOL},
    /* targets drawn in [0, 5): about one row in five ignored */
    {"cross_entropy_ignore", "param x: [4, 3, 5] = normal(1); input t: i32[4, 3];",
     "cross_entropy(x, t, ignore_index = 2)", "[]", H, TOL},
    {"reshape", "param a: [2, 3, 4] = normal(1);", "reshape(a, [4, -1]) * reshape(a, [4, 6])", "[4, 6]", H, TOL},
    {"transpose", "param a: [2, 3, 4] = normal(1);", "transpose(a, 0, 2)", "[4, 3, 2]", H, TOL},
    {"permute", "param a: [2, 3, 4] = normal(1);", "permute(a, [1, 2, 0])", "[3, 4, 2]", H, TOL},
    {"split_concat", "param a: [2, 6] = normal(1);", "concat(p, q * q)", "[2, 4]", H, TOL},
    {"split_unused_part", "param a: [2, 6] = normal(1);", "p * 2", "[2, 2]", H, TOL},
    {"heads", "param a: [2, 3, 8] = normal(1);", "heads(a, 2) * heads(a, 2)", "[2, 2, 3, 4]", H, TOL},
    {"merge_heads", "param a: [2, 2, 3, 4] = normal(1);", "merge_heads(a)", "[2, 3, 8]", H, TOL},
    {"rope", "param a: [2, 2, 5, 6] = normal(1);", "rope(a)", "[2, 2, 5, 6]", H, TOL},
    {"rope_interleaved", "param a: [2, 2, 5, 6] = normal(1);", "rope(a, theta = 500, interleaved)", "[2, 2, 5, 6]", H,
     TOL},
    {"attention", "param q: [2, 3, 4] = normal(1); param k: [2, 5, 4] = normal(1); param v: [2, 5, 3] = normal(1);",
     "attention(q, k, v)", "[2, 3, 3]", H, TOL},
    {"attention_causal", "param q: [2, 2, 4, 4] = normal(1); param k: [2, 2, 4, 4] = normal(1); param v: [2, 2, 4, 4] = normal(1);",
     "attention(q, k, v, causal)", "[2, 2, 4, 4]", H, TOL},
    /* Llama's chain, which passes/packed_attn.c makes rope_rows and attention_rows on the params' rows (grouped-query:
     * 2 query heads over 1 kv head; both rope forms) */
    {"attention_rows", "param q: [2, 5, 8] = normal(1); param k: [2, 5, 4] = normal(1); param v: [2, 5, 4] = normal(1);",
     "merge_heads(attention(rope(heads(q, 2), theta = 50), rope(heads(k, 1), interleaved), heads(v, 1), causal))",
     "[2, 5, 8]", H, TOL},
    {"tied", "param a: [3, 4] = normal(1);", "a @ transpose(a) + embedding(a, arange(3)) @ transpose(a)", "[3, 3]", H, TOL},
};

/* split needs a tuple assignment before y: patched in as its own declaration. */
static void fix_split_cases(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        if (!strncmp(cases[i].name, "split", 5))
            cases[i].decls = "param a: [2, 6] = normal(1);\n  p, q, r = split(a, 3, axis = -1);";
}

/* Parameters cross into Criterion's worker processes by value: pass indices, not the
 * Case structs, whose string pointers would not survive the trip. */
enum { N_CASES = sizeof cases / sizeof *cases };

ParameterizedTestParameters(autodiff, finite_differences)
{
    static int index[N_CASES];
    for (int i = 0; i < N_CASES; i++) index[i] = i;
    return cr_make_param_array(int, index, N_CASES);
}

ParameterizedTest(int *i, autodiff, finite_differences)
{
    fix_split_cases();
    check_case(&cases[*i]);
}
