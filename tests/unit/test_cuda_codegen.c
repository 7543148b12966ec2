/* tests/unit/test_cuda_codegen.c: the CUDA program (codegen/cuda_*.c, passes/fuse.c),
 * checked without a GPU.
 *
 * What no GPU is needed for is held to the CPU backend itself: every GEMM record of a
 * matmul is run here as the plain loop the record describes and compared with cpu_matmul;
 * the index of every layout kernel (its template arguments) and every broadcast load is
 * evaluated here, element by element, and compared with where the CPU kernel takes that element
 * from. The rest is structure: one kernel per fused group, writing only what outlives
 * it; no instruction for views and collectives; names deterministic and deduplicated.
 * On the samples, every op has the instructions its kind calls for, and fsc --emit cuda
 * writes them.
 * tests/cuda/nvrtc_compile.c compiles the modules.
 */
#include <criterion/criterion.h>
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "build.h"
#include "cuda.h"
#include "kernels.h"
#include "passes.h"
#include "rand.h"
#include "sample.h"

static Graph *g;
static char err[600];

static void setup(void) { g = ir_graph_new("t"); }
static void teardown(void) { ir_graph_free(g); }
TestSuite(cuda_codegen, .init = setup, .fini = teardown);

static int input(const char *name, DType dt, const int64_t *shape, int rank)
{
    return build_value(g, ROLE_INPUT, name, dt, shape, rank, -1, (Loc){0});
}
static int node(OpKind op, const int *in, int n_in, const Attr *attrs, int n_attr)
{
    return build_node(g, op, in, n_in, attrs, n_attr, -1, PHASE_FORWARD, (Loc){0});
}
static int out0(int n) { return ir_out(g, ir_node(g, n), 0); }

/* fuse and memplan, as the pipeline ends, then the plan and its CUDA program. */
static Plan *compile(void)
{
    Options o = {0};
    Diag d;
    diag_init(&d, "t", NULL, 0, stderr);
    cr_assert_eq(pass_fuse(g, &o, &d), 0);
    cr_assert_eq(pass_memplan(g, &o, &d), 0);
    config_default(&o.train);
    Plan *p = codegen_plan(g, &o.train, err, sizeof err);
    cr_assert_not_null(p, "%s", err);
    cr_assert_not_null(codegen_cuda_source(p));
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
    return p;
}

/* The instructions of op `op`: the first, and how many. */
static const PlanCuda *ins_of(const Plan *p, int op, int *n)
{
    const PlanCuda *first = NULL;
    *n = 0;
    for (int i = 0; i < p->n_cuda; i++)
        if (p->cuda[i].op == op && !(*n)++) first = &p->cuda[i];
    return first;
}

static int launches(const Plan *p)
{
    int n = 0;
    for (int i = 0; i < p->n_cuda; i++) n += p->cuda[i].kind == PLAN_CU_LAUNCH;
    return n;
}

/* A kernel's text in the module, from its signature to its closing brace. */
static char *kernel_text(const Plan *p, const PlanCuda *in)
{
    const char *src = codegen_cuda_source(p);
    char sig[160];
    snprintf(sig, sizeof sig, " %s(", plan_str(p, in->kernel));  // after `void` or `__launch_bounds__(..)`
    const char *at = strstr(src, sig);
    cr_assert_not_null(at, "kernel %s is not in the module", plan_str(p, in->kernel));
    const char *end = strstr(at, "\n}\n");
    cr_assert_not_null(end);
    return strndup(at, (size_t)(end - at + 2));
}

/* ---- an evaluator for the index expressions kernels use: i, integers, * / % + ( ) ---- */

typedef struct {
    const char *s;
    int64_t i;
} Ev;

static int64_t ev_sum(Ev *e);
static void ev_space(Ev *e)
{
    while (*e->s == ' ') e->s++;
}
static int64_t ev_atom(Ev *e)
{
    ev_space(e);
    if (*e->s == '(') {
        e->s++;
        int64_t v = ev_sum(e);
        ev_space(e);
        cr_assert_eq(*e->s, ')', "expected ')' at '%s'", e->s);
        e->s++;
        return v;
    }
    if (e->s[0] == 'i' && !isalnum((unsigned char)e->s[1]) && e->s[1] != '_') {
        e->s++;
        return e->i;
    }
    cr_assert(isdigit((unsigned char)*e->s), "unexpected '%s'", e->s);
    char *end;
    int64_t v = strtoll(e->s, &end, 10);
    for (e->s = end; *e->s == 'L';) e->s++;
    return v;
}
static int64_t ev_product(Ev *e)
{
    int64_t v = ev_atom(e);
    for (;;) {
        ev_space(e);
        char op = *e->s;
        if (op != '*' && op != '/' && op != '%') return v;
        e->s++;
        int64_t r = ev_atom(e);
        v = op == '*' ? v * r : op == '/' ? v / r : v % r;
    }
}
static int64_t ev_sum(Ev *e)
{
    int64_t v = ev_product(e);
    for (;;) {
        ev_space(e);
        if (*e->s != '+') return v;
        e->s++;
        v += ev_product(e);
    }
}

/* The expression in `text` between `open` and the first `close` after it. */
static char *between(const char *text, const char *open, const char *close)
{
    const char *a = strstr(text, open);
    cr_assert_not_null(a, "no '%s' in:\n%s", open, text);
    a += strlen(open);
    const char *b = strstr(a, close);
    cr_assert_not_null(b);
    return strndup(a, (size_t)(b - a));
}

static int64_t eval(const char *expr, int64_t i)
{
    Ev e = {expr, i};
    int64_t v = ev_sum(&e);
    ev_space(&e);
    cr_assert_eq(*e.s, 0, "trailing '%s' in '%s'", e.s, expr);
    return v;
}

/* ---- the CPU kernel of a node, on given data ------------------------------------------- */

static KTensor ktensor(const Value *v, void *data)
{
    KTensor t = {.data = data, .dtype = v->dtype == DT_F32 ? KT_F32 : v->dtype == DT_F16 ? KT_F16 : v->dtype == DT_BF16 ? KT_BF16 : KT_I32,
                 .rank = v->rank, .numel = ir_numel(v)};
    for (int d = 0; d < v->rank; d++) t.shape[d] = v->shape[d];
    return t;
}

/* Runs node n's CPU kernel; attributes by their position in the op's signature. */
static void run_cpu(int n, void **in, void **out)
{
    const Node *nd = ir_node(g, n);
    const OpInfo *info = op_info(nd->op);
    KCall k = {.n_in = nd->n_in, .n_out = nd->n_out};
    for (int i = 0; i < nd->n_in; i++) k.in[i] = ktensor(ir_value(g, ir_in(g, nd, i)), in[i]);
    for (int i = 0; i < nd->n_out; i++) k.out[i] = ktensor(ir_value(g, ir_out(g, nd, i)), out[i]);
    for (int a = 0; a < info->n_params; a++) {
        const OpParam *pa = &info->params[a];
        if (pa->kind == ARG_INTS) k.ints = ir_attr_ints(g, nd, pa->name, &k.n_ints);
        else if (pa->kind != ARG_TENSOR && pa->kind != ARG_TENSORS) k.attr[a] = ir_attr_float(g, nd, pa->name, pa->def);
    }
    cpu_kernel_by_name(op_name(nd->op))(&k);
}

/* ---- elementwise ----------------------------------------------------------------------- */

/* Each operand's load in a lone add is at the offset numpy broadcasting gives it. */
Test(cuda_codegen, broadcast_loads_index_like_numpy)
{
    static const struct {
        int64_t shape[3];
        int rank;
    } bs[] = {{{4}, 1}, {{3, 1}, 2}, {{2, 1, 4}, 3}, {{0}, 0}, {{2, 3, 4}, 3}};
    int x = input("x", DT_F32, DIMS(2, 3, 4));
    int adds[5];
    for (int k = 0; k < 5; k++) {
        int b = input("b", DT_F32, bs[k].shape, bs[k].rank);
        adds[k] = node(OP_add, INS(x, b), NULL, 0);
        ir_output_add(g, out0(adds[k]));
    }
    Plan *p = compile();
    for (int k = 0; k < 5; k++) {
        int n;
        const PlanCuda *in = ins_of(p, adds[k], &n);
        cr_assert_eq(n, 1);
        cr_assert_eq(in->n_args, 3);
        char *text = kernel_text(p, in), *ex = between(text, "ld(in0, ", ");"), *eb = between(text, "ld(in1, ", ");");
        const Value *b = ir_value(g, p->ids[in->args + 1]);
        for (int64_t i = 0; i < 24; i++) {
            int64_t c = i % 4, r = i / 4 % 3, o = i / 12, want = 0, s = 1;
            const int64_t at[3] = {o, r, c};
            for (int d = b->rank - 1; d >= 0; d--) {  // b's dims are the output's last rank dims
                want += (b->shape[d] == 1 ? 0 : at[3 - b->rank + d]) * s;
                s *= b->shape[d];
            }
            cr_assert_eq(eval(ex, i), i);
            cr_assert_eq(eval(eb, i), want, "b of rank %d, element %ld: '%s'", b->rank, (long)i, eb);
        }
        free(text), free(ex), free(eb);
    }
    plan_free(p);
}

/* A chain of elementwise nodes is one kernel at its last node, writing what outlives it. */
Test(cuda_codegen, fused_group_is_one_kernel)
{
    /* x and b made by nodes, so they are not persistent and memplan places them */
    int x0 = input("x0", DT_BF16, DIMS(8, 4)), b0 = input("b0", DT_BF16, DIMS(2, 8));
    int x = out0(node(OP_transpose, INS(x0), NULL, 0));
    int b = out0(node(OP_slice, INS(b0), ATTRS(AI("axis", 0), AI("start", 1), AI("len", 1))));
    int n0 = node(OP_add, INS(x, b), NULL, 0);
    int n1 = node(OP_gelu, INS(out0(n0)), NULL, 0);
    int n2 = node(OP_mul, INS(out0(n1), x), NULL, 0);
    int n3 = node(OP_transpose, INS(out0(n2)), NULL, 0);  // not elementwise: the chain ends
    int n4 = node(OP_relu, INS(out0(n0)), NULL, 0);       // reads the group's first output
    ir_output_add(g, out0(n3));
    ir_output_add(g, out0(n4));
    Plan *p = compile();
    for (int n = n0; n <= n2; n++) cr_assert_eq(g->nodes[n].group, n0);
    cr_assert_eq(g->nodes[n3].group, -1);
    cr_assert_eq(g->nodes[n4].group, -1, "a lone elementwise node is no group");
    int n;
    ins_of(p, n0, &n);
    cr_assert_eq(n, 0);
    ins_of(p, n1, &n);
    cr_assert_eq(n, 0);
    const PlanCuda *in = ins_of(p, n2, &n);
    cr_assert_eq(n, 1);
    /* inputs x, b; outputs: n0's (n4 reads it later) and n2's; n1's stays in registers */
    const int want[] = {x, b, out0(n0), out0(n2)};
    cr_assert_eq(in->n_args, 4);
    for (int k = 0; k < 4; k++) cr_assert_eq(p->ids[in->args + k], want[k], "arg %d", k);
    char *text = kernel_text(p, in);
    cr_assert(strstr(text, "fs_gelu(u)") && strstr(text, "fs_rn_bf16(u + v)") && strstr(text, "fs_rn_bf16(u * v)"), "%s", text);
    cr_assert_eq(launches(p), 5, "the transpose and slice, the group, the transpose, the relu");
    /* The group reads x and b at its last node: no member's output takes their bytes. */
    for (int m = n0; m <= n2; m++) {
        const Value *o = ir_value(g, out0(m));
        for (int k = 0; k < 2; k++) {
            const Value *v = ir_value(g, k ? b : x);
            cr_assert(o->offset >= v->offset + ir_nbytes(v) || v->offset >= o->offset + ir_nbytes(o));
        }
    }
    cr_assert_geq(ir_value(g, out0(n1))->live_end, n2);
    free(text);
    plan_free(p);
}

/* Only consecutive nodes of one shape, block and phase, each reading an earlier member. */
Test(cuda_codegen, fuse_rules)
{
    int x = input("x", DT_F32, DIMS(4, 8)), y = input("y", DT_F32, DIMS(4, 8)), v = input("v", DT_F32, DIMS(8));
    int a = node(OP_exp, INS(x), NULL, 0);
    int b = node(OP_exp, INS(y), NULL, 0);                  // does not read a: a new run
    int c = node(OP_neg, INS(v), NULL, 0);                  // [8]: not b's shape
    int d = node(OP_add, INS(out0(c), out0(b)), NULL, 0);   // [4, 8]: not c's shape
    int e = build_node(g, OP_sqrt, INS(out0(d)), NULL, 0, -1, PHASE_BACKWARD, (Loc){0});  // another phase
    int f = build_node(g, OP_sigmoid, INS(out0(e)), NULL, 0, -1, PHASE_BACKWARD, (Loc){0});
    ir_output_add(g, out0(a));
    ir_output_add(g, out0(f));
    Plan *p = compile();
    const int want[] = {-1, -1, -1, -1, e, e};
    for (int n = a; n <= f; n++) cr_assert_eq(g->nodes[n].group, want[n - a], "node %d", n);
    cr_assert_eq(launches(p), 5);
    plan_free(p);
}

/* i32 arithmetic wraps (unsigned), and a cast rounds through its output's dtype. */
Test(cuda_codegen, int_and_cast_expressions)
{
    int i = input("i", DT_I32, DIMS(16)), f = input("f", DT_F32, DIMS(16));
    int a = node(OP_add, INS(i, i), NULL, 0);
    int c = node(OP_cast, INS(f), ATTRS(AI("to", DT_F16)));
    ir_output_add(g, out0(a));
    ir_output_add(g, out0(c));
    Plan *p = compile();
    int n;
    char *ta = kernel_text(p, ins_of(p, a, &n)), *tc = kernel_text(p, ins_of(p, c, &n));
    cr_assert(strstr(ta, "(int)((unsigned)u + (unsigned)v)") && strstr(ta, "out0[i] = t0;"), "%s", ta);
    cr_assert_eq(ins_of(p, a, &n)->n_args, 2, "one parameter for an operand read twice");
    cr_assert(strstr(tc, "__half *out0") && strstr(tc, "fs_rn_f16(u)"), "%s", tc);
    free(ta), free(tc);
    plan_free(p);
}

/* ---- layout: every gather reads what the CPU kernel reads ----------------------------- */

/* The offset of element i that the first FsIndex<FsTerm<OS, SZ, ST>...> in `text` gives
 * (codegen/kernels/index.cuh): the sum of i / OS % SZ * ST, SZ 0 wrapping at nothing. */
static int64_t index_at(const char *text, int64_t i)
{
    const char *s = strstr(text, "FsIndex<");
    cr_assert_not_null(s, "no FsIndex in:\n%s", text);
    int64_t at = 0;
    for (s += 8; !strncmp(s, "FsTerm<", 7); s += 2) {
        long long os, sz, st;
        int len = 0;
        cr_assert_eq(sscanf(s, "FsTerm<%lldLL, %lldLL, %lldLL>%n", &os, &sz, &st, &len), 3, "bad term '%s'", s);
        cr_assert(os > 0 && sz >= 0, "'%s'", s);
        int64_t q = i / os;
        at += (sz ? q % sz : q) * st;
        s += len;
        if (*s != ',') break;
    }
    cr_assert_eq(*s, '>', "'%s'", s);
    return at;
}

/* Node n moves elements: its kernel, `fs_gather<I, N, AT>(x [+ BASE], y)`, must take
 * element i of the output from where the CPU kernel does. Each input element holds its own index as its bits
 * (the kernels move bits, whatever the dtype), so the CPU's output says where each
 * element came from. */
static void check_gather(const Plan *p, int n)
{
    const Node *nd = ir_node(g, n);
    const Value *x = ir_value(g, ir_in(g, nd, 0)), *y = ir_value(g, ir_out(g, nd, 0));
    int64_t nx = ir_numel(x), ny = ir_numel(y), *ys = malloc(sizeof(int64_t) * (size_t)ny);
    int wide = dtype_size(x->dtype) == 4;
    uint32_t *x4 = malloc(4 * (size_t)nx), *y4 = malloc(4 * (size_t)ny);
    uint16_t *x2 = (uint16_t *)x4, *y2 = (uint16_t *)y4;
    for (int64_t i = 0; i < nx; i++) wide ? (void)(x4[i] = (uint32_t)i) : (void)(x2[i] = (uint16_t)i);
    run_cpu(n, (void *[]){x4}, (void *[]){y4});
    for (int64_t i = 0; i < ny; i++) ys[i] = wide ? y4[i] : y2[i];
    int k;
    const PlanCuda *in = ins_of(p, n, &k);
    cr_assert_eq(k, 1, "%s: %d instructions", op_name(nd->op), k);
    char *text = kernel_text(p, in);
    cr_assert(strstr(text, dtype_size(x->dtype) == 4 ? "const unsigned int *x" : "const unsigned short *x"), "%s", text);
    const char *call = strstr(text, "fs_gather<"), *from = call ? strstr(call, ">(x") : NULL;
    cr_assert_not_null(from, "no gather in:\n%s", text);
    long long base = 0;
    if (strncmp(from, ">(x, y)", 7)) cr_assert_eq(sscanf(from, ">(x + %lldLL, y)", &base), 1, "%s", text);
    for (int64_t i = 0; i < ny; i++)
        cr_assert_eq(base + index_at(call, i), ys[i], "%s: element %ld from %lld, the CPU takes %ld (%s)",
                     op_name(nd->op), (long)i, base + (long long)index_at(call, i), (long)ys[i], call);
    free(text), free(x4), free(y4), free(ys);
}

Test(cuda_codegen, layout_gathers_match_the_cpu)
{
    int x = input("x", DT_F32, DIMS(2, 3, 4, 5)), h = input("h", DT_BF16, DIMS(2, 6, 8)), s = input("s", DT_F32, DIMS(3, 1, 5));
    int ns[] = {
        node(OP_transpose, INS(x), NULL, 0),
        node(OP_transpose, INS(x), ATTRS(AI("a", 0), AI("b", 2))),
        node(OP_permute, INS(x), ATTRS(AL("dims", 2, 0, 3, 1))),
        node(OP_permute, INS(x), ATTRS(AL("dims", 0, 1, 3, 2))),
        node(OP_heads, INS(h), ATTRS(AI("n", 4))),
        node(OP_expand, INS(s), ATTRS(AL("shape", 2, 3, 4, 5))),
        node(OP_slice, INS(x), ATTRS(AI("axis", 2), AI("start", 1), AI("len", 2))),
        node(OP_slice, INS(x), ATTRS(AI("axis", 0), AI("start", 1), AI("len", 1))),
        node(OP_copy, INS(x), NULL, 0),
    };
    int heads = ns[4];
    int merged = node(OP_merge_heads, INS(out0(heads)), NULL, 0);
    for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) ir_output_add(g, out0(ns[k]));
    ir_output_add(g, out0(merged));
    Plan *p = compile();
    for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) check_gather(p, ns[k]);
    check_gather(p, merged);
    plan_free(p);
}

/* split: `fs_split<I, PART, STEP, AT>(x, y0, y1, y2)` takes element i of part t from
 * x[AT(i) + t STEP]. */
Test(cuda_codegen, split_matches_the_cpu)
{
    int x = input("x", DT_F32, DIMS(2, 6, 3));
    int s = node(OP_split, INS(x), ATTRS(AI("n", 3), AI("axis", 1)));
    for (int t = 0; t < 3; t++) ir_output_add(g, ir_out(g, ir_node(g, s), t));
    Plan *p = compile();
    float xs[36], ys[3][12];
    for (int i = 0; i < 36; i++) xs[i] = (float)i;
    run_cpu(s, (void *[]){xs}, (void *[]){ys[0], ys[1], ys[2]});
    int k;
    const PlanCuda *in = ins_of(p, s, &k);
    cr_assert(k == 1 && in->n_args == 4);
    char *text = kernel_text(p, in);
    const char *call = strstr(text, "fs_split<");
    long long part, step;
    cr_assert(call && sscanf(call, "fs_split<int, %lldLL, %lldLL, ", &part, &step) == 2, "%s", text);
    cr_assert(part == 12 && strstr(call, ">(x, y0, y1, y2)"), "%s", text);
    for (int t = 0; t < 3; t++)
        for (int64_t i = 0; i < 12; i++)
            cr_assert_eq(index_at(call, i) + t * step, (int64_t)ys[t][i], "part %d element %ld", t, (long)i);
    free(text);
    plan_free(p);
}

/* Views of the same bytes and collectives have no instruction; concat is one launch. */
Test(cuda_codegen, views_and_collectives_have_no_instruction)
{
    int x = input("x", DT_F32, DIMS(4, 6)), y = input("y", DT_F32, DIMS(4, 2));
    int r = node(OP_reshape, INS(x), ATTRS(AL("shape", 24)));
    int a = node(OP_all_reduce, INS(out0(r)), ATTRS(AI("world", 2)));
    int c = node(OP_concat, INS(x, y), ATTRS(AI("axis", 1)));
    ir_output_add(g, out0(a));
    ir_output_add(g, out0(c));
    Plan *p = compile();
    int n;
    ins_of(p, r, &n);
    cr_assert_eq(n, 0, "reshape is a view");
    ins_of(p, a, &n);
    cr_assert_eq(n, 0, "collectives run on NCCL");
    const PlanCuda *in = ins_of(p, c, &n);
    cr_assert(n == 1 && in->n_args == 3);
    plan_free(p);
}

/* ---- matmul: the GEMM records, run as the loops they describe, equal cpu_matmul ------- */

static void run_gemms(const Plan *p, int op, const float *A, const float *B, float *C)
{
    int n;
    const PlanCuda *r = ins_of(p, op, &n);
    cr_assert_gt(n, 0);
    for (int k = 0; k < n; k++, r++) {
        cr_assert_eq(r->kind, PLAN_CU_GEMM);
        for (int64_t b = 0; b < r->batch; b++) {
            const float *a = A + r->a_off + b * r->stride_a, *bb = B + r->b_off + b * r->stride_b;
            float *c = C + r->c_off + b * r->stride_c;
            for (int64_t i = 0; i < r->m; i++)
                for (int64_t j = 0; j < r->n; j++) {
                    double s = 0;
                    for (int64_t q = 0; q < r->k; q++)
                        s += (double)(r->ta ? a[q * r->lda + i] : a[i * r->lda + q]) *
                             (r->tb ? bb[j * r->ldb + q] : bb[q * r->ldb + j]);
                    c[i * r->ldc + j] = (float)s;
                }
        }
    }
}

Test(cuda_codegen, matmul_gemms_match_the_cpu)
{
    static const struct {
        int64_t a[4], b[4];
        int ra, rb, ta, tb, records;
    } cases[] = {
        {{6, 5}, {5, 7}, 2, 2, 0, 0, 1},       {{5, 6}, {5, 7}, 2, 2, 1, 0, 1},
        {{6, 5}, {7, 5}, 2, 2, 0, 1, 1},       {{5, 6}, {7, 5}, 2, 2, 1, 1, 1},
        {{2, 3, 6, 5}, {5, 7}, 4, 2, 0, 0, 1},  // a's batch folds into M
        {{2, 3, 6, 5}, {2, 3, 5, 7}, 4, 4, 0, 0, 1},  // one strided call over 6
        {{2, 3, 6, 5}, {3, 5, 7}, 4, 3, 0, 0, 2},     // b broadcasts over the outer dim
        {{3, 1, 6, 5}, {1, 4, 5, 7}, 4, 4, 0, 0, 3},  // both broadcast
        {{2, 5, 6}, {5, 7}, 3, 2, 1, 0, 1},           // transposed a does not fold
        {{5}, {5, 7}, 1, 2, 0, 0, 1},           {{6, 5}, {5}, 2, 1, 0, 0, 1},
        {{5}, {5}, 1, 1, 0, 0, 1},              {{2, 6, 5}, {5}, 3, 1, 0, 0, 1},
        {{5}, {2, 5, 7}, 1, 3, 0, 0, 1},        {{2, 3, 6, 5}, {2, 3, 7, 5}, 4, 4, 0, 1, 1},
    };
    int ops[sizeof cases / sizeof *cases];
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        int a = input("a", DT_F32, cases[k].a, cases[k].ra), b = input("b", DT_F32, cases[k].b, cases[k].rb);
        ops[k] = node(OP_matmul, INS(a, b), ATTRS(AI("ta", cases[k].ta), AI("tb", cases[k].tb)));
        ir_output_add(g, out0(ops[k]));
    }
    Plan *p = compile();
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const Node *nd = ir_node(g, ops[k]);
        const Value *va = ir_value(g, ir_in(g, nd, 0)), *vb = ir_value(g, ir_in(g, nd, 1)), *vc = ir_value(g, out0(ops[k]));
        int64_t na = ir_numel(va), nb = ir_numel(vb), nc = ir_numel(vc);
        float *A = malloc(sizeof(float) * (size_t)na), *B = malloc(sizeof(float) * (size_t)nb);
        float *C = malloc(sizeof(float) * (size_t)nc), *R = malloc(sizeof(float) * (size_t)nc);
        for (int64_t i = 0; i < na; i++) A[i] = urand(-1, 1);
        for (int64_t i = 0; i < nb; i++) B[i] = urand(-1, 1);
        for (int64_t i = 0; i < nc; i++) C[i] = NAN;
        run_cpu(ops[k], (void *[]){A, B}, (void *[]){R});
        run_gemms(p, ops[k], A, B, C);
        int n;
        ins_of(p, ops[k], &n);
        cr_assert_eq(n, cases[k].records, "case %zu: %d GEMMs", k, n);
        for (int64_t i = 0; i < nc; i++)
            cr_assert_float_eq(C[i], R[i], 1e-5, "case %zu: element %ld: %g, the CPU %g", k, (long)i, C[i], R[i]);
        free(A), free(B), free(C), free(R);
    }
    plan_free(p);
}

/* ---- the optimizer and constants: one launch each, the CPU's formulas ------------------- */

Test(cuda_codegen, optimizer_and_constants)
{
    int w = input("w", DT_F32, DIMS(10)), gr = input("g", DT_F32, DIMS(10)), m = input("m", DT_F32, DIMS(10));
    int v = input("v", DT_F32, DIMS(10)), step = input("step", DT_I32, NULL, 0);
    int lr = out0(node(OP_lr_at, INS(step), ATTRS(AF("lr", 1e-3), AI("schedule", 1), AI("warmup", 3), AI("steps", 10), AF("min_lr", 1e-4))));
    int coef = out0(node(OP_clip_coef, INS(out0(node(OP_scalar, NULL, 0, ATTRS(AF("value", 2.5))))), ATTRS(AF("max_norm", 1), AI("skip_nonfinite", 1))));
    int ad = node(OP_adamw, INS(w, gr, m, v, lr, coef, step),
                  ATTRS(AF("beta1", 0.9), AF("beta2", 0.95), AF("eps", 1e-8), AF("weight_decay", 0.1)));
    int sg = node(OP_sgd, INS(w, gr, m, lr, coef, step), ATTRS(AF("momentum", 0.9), AF("weight_decay", 0)));
    int cs = node(OP_count_step, INS(step, coef), NULL, 0);
    int fl = node(OP_full, NULL, 0, ATTRS(AF("value", -0.5), AL("shape", 3, 4)));
    ir_output_add(g, out0(fl));
    Plan *p = compile();
    cr_assert_eq(launches(p), g->n_nodes, "one launch per node");
    int n;
    const PlanCuda *in = ins_of(p, ad, &n);
    cr_assert_eq(in->n_args, 7);
    char *t = kernel_text(p, in);
    /* optim.cuh: 10 elements, torch's lerp for a weight below 0.5; weight decay, beta1 and
     * beta2 exact doubles, then 1 - beta1, beta2, 1 - beta2 and eps as the CPU rounds them. */
    cr_assert(strstr(t, "fs_adamw<int, 10LL, true>(p, g, m, v, lr, coef, step, 0.10000000000000001, "
                        "0.90000000000000002, 0.94999999999999996, 0.100000001f, 0.949999988f, 0.0500000007f, "
                        "9.99999994e-09f)"), "%s", t);
    free(t);
    t = kernel_text(p, ins_of(p, sg, &n));
    cr_assert(strstr(t, "fs_sgd<int, 10LL, true>(p, g, buf, lr, coef, step, 0.899999976f, "), "%s", t);  // momentum
    free(t);
    t = kernel_text(p, ins_of(p, cs, &n));
    cr_assert(strstr(t, "fs_count_step(count, coef)"), "%s", t);
    free(t);
    t = kernel_text(p, ins_of(p, fl, &n));
    cr_assert(strstr(t, "fs_full<int, 12LL>(y, -0.5f)"), "%s", t);  // fill.cuh: 12 elements, the value exact
    free(t);
    plan_free(p);
}

/* A loss's gradient with an ignore_index divides by the counted targets once: target_count is one block that
 * counts them, and the gradient's rows read dloss already divided (per_row: ir/grad.c). A gradient with an
 * ignore_index but no per_row (a plan of an older fsc) is a clear error, not rows that each count every target. */
Test(cuda_codegen, ignore_index_counts_once)
{
    int lg = input("lg", DT_F32, DIMS(6, 5)), tg = input("tg", DT_I32, DIMS(6)), dl = input("dl", DT_F32, NULL, 0);
    int cnt = node(OP_target_count, INS(tg), ATTRS(AI("ignore_index", -100)));
    int share = out0(node(OP_div, INS(dl, out0(cnt)), NULL, 0));
    int bw = node(OP_cross_entropy_bwd, INS(lg, tg, share), ATTRS(AI("ignore_index", -100), AI("per_row", 1)));
    ir_output_add(g, out0(bw));
    Plan *p = compile();
    int n;
    const PlanCuda *in = ins_of(p, cnt, &n);
    cr_assert_eq(n, 1, "target_count: one launch");
    cr_assert_eq(in->grid[0] * in->grid[1] * in->grid[2], 1, "target_count: one block");
    char *t = kernel_text(p, in);
    cr_assert(strstr(t, "fs_target_count<6LL, -100LL>(tg, out)"), "%s", t);
    free(t);
    plan_free(p);

    ir_graph_free(g);
    g = ir_graph_new("t");
    lg = input("lg", DT_F32, DIMS(6, 5)), tg = input("tg", DT_I32, DIMS(6)), dl = input("dl", DT_F32, NULL, 0);
    ir_output_add(g, out0(node(OP_cross_entropy_bwd, INS(lg, tg, dl), ATTRS(AI("ignore_index", -100)))));
    Options o = {0};
    Diag d;
    diag_init(&d, "t", NULL, 0, stderr);
    cr_assert_eq(pass_memplan(g, &o, &d), 0);
    config_default(&o.train);
    cr_assert_null(p = codegen_plan(g, &o.train, err, sizeof err));
    cr_assert(strstr(err, "cross_entropy_bwd: an ignore_index without its count (per_row): a plan from an older fsc; "
                          "compile it again"), "%s", err);
}

/* ---- names -------------------------------------------------------------------------------- */

Test(cuda_codegen, names_are_deterministic_and_shared)
{
    int x = input("x", DT_F32, DIMS(8, 8)), y = input("y", DT_F32, DIMS(8, 8));
    int a = node(OP_tanh, INS(x), NULL, 0), b = node(OP_tanh, INS(y), NULL, 0);
    ir_output_add(g, out0(a));
    ir_output_add(g, out0(b));
    Plan *p = compile(), *q = codegen_plan(g, &(TrainConfig){0}, err, sizeof err);
    cr_assert_not_null(q, "%s", err);
    int n;
    const char *ka = plan_str(p, ins_of(p, a, &n)->kernel), *kb = plan_str(p, ins_of(p, b, &n)->kernel);
    cr_assert_str_eq(ka, kb, "the same op on the same shapes: one kernel");
    cr_assert(!strncmp(ka, "tanh_", 5) && strlen(ka) == 13, "%s", ka);
    const char *src = codegen_cuda_source(p), *first = strstr(src, ka);
    cr_assert(first && !strstr(first + 1, ka), "defined once");
    cr_assert_str_eq(src, codegen_cuda_source(q));
    cr_assert_str_eq(plan_str(q, ins_of(q, a, &n)->kernel), ka);
    plan_free(p);
    plan_free(q);
}

/* ---- the samples ---------------------------------------------------------------------- */

static int same_bytes(const Graph *gr, const Node *nd)
{
    const Value *x = ir_value(gr, ir_in(gr, nd, 0)), *y = ir_value(gr, ir_out(gr, nd, 0));
    return x->offset == y->offset && x->rank_stride == y->rank_stride;
}

/* matmul: GEMMs whose k is the inner dim and which cover the output once. */
static void check_matmul(const Plan *p, const Graph *gr, int op)
{
    const Node *nd = ir_node(gr, op);
    const Value *a = ir_value(gr, ir_in(gr, nd, 0)), *c = ir_value(gr, ir_out(gr, nd, 0));
    int ta = a->rank >= 2 && ir_attr_int(gr, nd, "ta", 0), n;
    int64_t K = a->rank >= 2 && ta ? a->shape[a->rank - 2] : a->shape[a->rank - 1], covered = 0;
    const PlanCuda *in = ins_of(p, op, &n);
    cr_assert_gt(n, 0, "matmul %d has no GEMM", op);
    for (int k = 0; k < n; k++, in++) {
        cr_assert_eq(in->kind, PLAN_CU_GEMM);
        cr_assert_eq(in->k, K, "matmul %d: k %ld, inner dim %ld", op, (long)in->k, (long)K);
        covered += in->m * in->n * in->batch;
    }
    cr_assert_eq(covered, ir_numel(c), "matmul %d: GEMMs cover %ld of %ld outputs", op, (long)covered, (long)ir_numel(c));
}

/* Every op has the instructions its kind calls for; returns the launches fusion saved. */
static int check_program(const Plan *p, const Graph *gr, const char *what)
{
    const char *src = codegen_cuda_source(p);
    cr_assert_not_null(src, "%s: no CUDA program", what);
    int saved = 0;
    for (int op = 0; op < gr->n_nodes; op++) {
        const Node *nd = ir_node(gr, op);
        int flags = op_info(nd->op)->flags, n, want = -1;  // -1: at least one
        const PlanCuda *in = ins_of(p, op, &n);
        int member = nd->group >= 0, continues = member && op + 1 < gr->n_nodes && gr->nodes[op + 1].group == nd->group;
        if (continues) want = 0, saved++;
        else if (member) want = 1;
        else if (flags & OPF_COLLECTIVE || nd->op == OP_buffer) want = 0;  // buffer: its views are written
        else if (nd->op == OP_reshape || nd->op == OP_copy) want = !same_bytes(gr, nd);
        else if (nd->op == OP_matmul) check_matmul(p, gr, op);
        else if (flags & (OPF_ELEMWISE | OPF_LAYOUT | OPF_EFFECT) || nd->op == OP_lr_at || nd->op == OP_clip_coef ||
                 nd->op == OP_scalar || nd->op == OP_full || nd->op == OP_arange || nd->op == OP_expand)
            want = 1;
        if (want >= 0) cr_assert_eq(n, want, "%s: op %d (%s): %d instructions, expected %d", what, op, op_name(nd->op), n, want);
        else cr_assert_gt(n, 0, "%s: op %d (%s) has no instruction", what, op, op_name(nd->op));
        for (int k = 0; k < n; k++)
            if (in[k].kind == PLAN_CU_LAUNCH) {
                char sig[160];
                snprintf(sig, sizeof sig, " %s(", plan_str(p, in[k].kernel));
                cr_assert(strstr(src, sig), "%s: op %d: kernel %s is not defined", what, op, plan_str(p, in[k].kernel));
            }
    }
    return saved;
}

static const Setting FP[] = {{"precision", "fp32"}}, F16[] = {{"precision", "fp16"}}, B16[] = {{"precision", "bf16"}};
static const Setting FSDP[] = {{"precision", "bf16"}, {"shard", "fsdp"}, {"world", "2"}}, RECOMPUTE[] = {{"recompute", "Block"}};
/* The matmuls' biases and GELUs as ops of their own (passes/epilogue.c off): chains the fuse pass joins. */
static const Setting UNFUSED[] = {{"precision", "bf16"}, {"fuse_gemm", "0"}};

Test(cuda_codegen, every_op_of_every_sample)
{
    const struct {
        const char *file;
        const Define *defs;
        int n_defs;
        const Setting *set;
        int n_set;
    } runs[] = {
        {"gpt2.fsm", SAMPLE_GPT2, 6, FP, 1},  {"gpt2.fsm", SAMPLE_GPT2, 6, F16, 1},   {"gpt2.fsm", SAMPLE_GPT2, 6, B16, 1},
        {"llama.fsm", SAMPLE_LLAMA, 7, FP, 1}, {"llama.fsm", SAMPLE_LLAMA, 7, F16, 1}, {"llama.fsm", SAMPLE_LLAMA, 7, B16, 1},
        {"mlp.fsm", NULL, 0, FP, 1},           {"mlp.fsm", NULL, 0, F16, 1},           {"mlp.fsm", NULL, 0, B16, 1},
        {"gpt2.fsm", SAMPLE_GPT2, 6, FSDP, 3}, {"gpt2.fsm", SAMPLE_GPT2, 6, RECOMPUTE, 1},
        {"gpt2.fsm", SAMPLE_GPT2, 6, UNFUSED, 2},
    };
    for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
        Graph *gr;
        Plan *p = sample_compile(runs[r].file, runs[r].defs, runs[r].n_defs, runs[r].set, runs[r].n_set, &gr);
        char what[96];
        snprintf(what, sizeof what, "%s %s%s", runs[r].file, runs[r].set[runs[r].n_set - 1].key, runs[r].set[runs[r].n_set - 1].value);
        int saved = check_program(p, gr, what);
        if (runs[r].set == UNFUSED) cr_assert_gt(saved, 0, "%s: fusion saved no launch", what);
        cr_assert_eq(plan_meta_int(p, "cuda_workspace_bytes", 0), 32 << 20);
        ir_graph_free(gr);
        plan_free(p);
    }
}

Test(cuda_codegen, samples_compile_the_same_twice)
{
    Plan *p = sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, B16, 1, NULL), *q = sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, B16, 1, NULL);
    cr_assert_str_eq(codegen_cuda_source(p), codegen_cuda_source(q));
    cr_assert_eq(p->n_cuda, q->n_cuda);
    for (int i = 0; i < p->n_cuda; i++) {
        cr_assert_eq(p->cuda[i].op, q->cuda[i].op);
        cr_assert_str_eq(plan_str(p, p->cuda[i].kernel), plan_str(q, q->cuda[i].kernel));
    }
    plan_free(p);
    plan_free(q);
}

/* fsc --emit cuda DIR: the module as the plan has it, and one line per instruction. */
Test(cuda_codegen, fsc_emit_cuda)
{
    char dir[] = "/tmp/test_cuda_codegen.XXXXXX", cmd[1024], path[160];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "%s/fsc %s/samples/mlp.fsm -q --emit cuda %s/out", FS_BINARY_DIR, FS_SOURCE_DIR, dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    Plan *p = sample_compile("mlp.fsm", NULL, 0, NULL, 0, NULL);
    snprintf(path, sizeof path, "%s/out/kernels.cu", dir);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    static char text[1 << 20];
    text[fread(text, 1, sizeof text - 1, f)] = 0;
    fclose(f);
    cr_assert_str_eq(text, codegen_cuda_source(p));
    snprintf(path, sizeof path, "%s/out/program.txt", dir);
    f = fopen(path, "r");
    cr_assert_not_null(f);
    int lines = 0, gemms = 0;
    char line[1024];
    while (fgets(line, sizeof line, f))
        if (line[0] != '#') lines++, gemms += strstr(line, " GEMM m ") != NULL;
    fclose(f);
    cr_assert_eq(lines, p->n_cuda);
    cr_assert_eq(gemms, p->n_cuda - launches(p));
    plan_free(p);
    snprintf(cmd, sizeof cmd, "rm -r %s", dir);
    cr_assert_eq(system(cmd), 0);
}
