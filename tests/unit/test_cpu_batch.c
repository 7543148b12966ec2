/* tests/unit/test_cpu_batch.c: calls run as one parallel region (runtime/cpu/group.c,
 * cpu_adamw_many) against the same calls run one by one: bit for bit,
 * at 1 and 2 threads, on sizes that are no multiple of any chunk. Outputs start as
 * NaN, so an element a batched run leaves unwritten differs.
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
#include "sample.h"

#define S(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}
#define NOSHAPE 0, NULL

static void *bufs[512];
static int nbufs;

static void cleanup(void)
{
    for (int i = 0; i < nbufs; i++) free(bufs[i]);
    nbufs = 0;
    omp_set_num_threads(2);
}
TestSuite(cpu_batch, .fini = cleanup);

static KTensor ten(int dtype, int rank, const int64_t *shape)
{
    KTensor t = {.dtype = dtype, .rank = rank, .numel = 1};
    for (int d = 0; d < rank; d++) t.shape[d] = shape[d], t.numel *= shape[d];
    uint32_t *p = malloc((size_t)t.numel * 4 + 4);
    cr_assert(p && nbufs < 512);
    for (int64_t i = 0; i < t.numel; i++) p[i] = 0x7fc00000u;
    bufs[nbufs++] = p;
    t.data = p;
    return t;
}

static int64_t nbytes(const KTensor *t) { return t->numel * (t->dtype == KT_F16 || t->dtype == KT_BF16 ? 2 : 4); }

static KTensor rnd(int dtype, int rank, const int64_t *shape, float lo, float hi)
{
    KTensor t = ten(dtype, rank, shape);
    for (int64_t i = 0; i < t.numel; i++) {
        float v = urand(lo, hi);
        if (dtype == KT_F32) ((float *)t.data)[i] = v;
        else ((uint16_t *)t.data)[i] = dtype == KT_BF16 ? cpu_f32_to_bf16(v) : cpu_f32_to_f16(v);
    }
    return t;
}

static KTensor copy(const KTensor *t)
{
    KTensor c = ten(t->dtype, t->rank, t->shape);
    memcpy(c.data, t->data, (size_t)nbytes(t));
    return c;
}

static void expect_same(const KTensor *a, const KTensor *b, const char *what, int th)
{
    cr_expect(!memcmp(a->data, b->data, (size_t)nbytes(a)), "%s differs from the single calls at %d thread(s)", what,
              th);
}

/* ---- fused groups ---------------------------------------------------------------------- */

/* The chain t0 = x + b, t1 = gelu(t0), t2 = t1 * y, t3 = gelu_bwd(t0, t2), t4 = t3 - c,
 * every intermediate of the group's shape in dtype `dt`; b and c broadcast. */
static void group_case(int rank, const int64_t *shape, int brank, const int64_t *bshape, int crank,
                       const int64_t *cshape, int dt, int want_split)
{
    KTensor x = rnd(dt, rank, shape, -2, 2), y = rnd(dt, rank, shape, -1, 1);
    KTensor b = rnd(dt, brank, bshape, -1, 1), c = rnd(dt, crank, cshape, -1, 1);
    CpuKernel fn[5] = {cpu_add, cpu_gelu, cpu_mul, cpu_gelu_bwd, cpu_sub};
    for (int th = 1; th <= 2; th++) {
        omp_set_num_threads(th);
        KTensor one[5], all[5];
        for (int i = 0; i < 5; i++) one[i] = ten(dt, rank, shape), all[i] = ten(dt, rank, shape);
        KCall k1[5], k2[5];
        for (int run = 0; run < 2; run++) {
            KTensor *o = run ? all : one;
            KCall *k = run ? k2 : k1;
            KTensor in[5][2] = {{x, b}, {o[0]}, {o[1], y}, {o[0], o[2]}, {o[3], c}};
            int n_in[5] = {2, 1, 2, 2, 2};
            for (int m = 0; m < 5; m++) {
                k[m] = (KCall){.n_in = n_in[m], .n_out = 1, .out = {o[m]}};
                for (int i = 0; i < n_in[m]; i++) k[m].in[i] = in[m][i];
            }
        }
        const KCall *grp[5] = {&k2[0], &k2[1], &k2[2], &k2[3], &k2[4]};
        int split = cpu_group_split(grp, 5);
        cr_expect_eq(split, want_split, "split %d, expected %d", split, want_split);
        for (int m = 0; m < 5; m++) fn[m](&k1[m]);
        cpu_group_run(fn, grp, 5, split);
        const char *names[5] = {"x + b", "gelu", "* y", "gelu_bwd", "- c"};
        for (int m = 0; m < 5; m++) expect_same(&all[m], &one[m], names[m], th);
    }
}

Test(cpu_batch, group_bias_over_rows)
{
    group_case(S(3, 37, 129), S(129), NOSHAPE, KT_F32, 2);   // a bias [C], a scalar c
    group_case(S(2, 300, 77), S(77), S(1), KT_F32, 2);
}

Test(cpu_batch, group_mixed_broadcast)
{
    group_case(S(5, 7, 901), S(5, 1, 901), S(901), KT_F32, 1);  // b broadcasts along dim 1 only
    group_case(S(3, 40001), S(3, 1), S(1, 40001), KT_F32, 1);   // b and c each broadcast differently
}

Test(cpu_batch, group_no_broadcast_long)
{
    group_case(S(17, 5003), S(17, 5003), S(1), KT_F32, 2);
    group_case(S(100003), S(100003), NOSHAPE, KT_F32, 1);
}

Test(cpu_batch, group_bf16)
{
    group_case(S(4, 33, 131), S(131), NOSHAPE, KT_BF16, 2);
    group_case(S(4, 33, 131), S(131), NOSHAPE, KT_F16, 2);
}

/* ---- adamw --------------------------------------------------------------- */

static const int64_t SIZES[] = {1, 100, 4097, 40000, 70001, 8192};
enum { NS = sizeof SIZES / sizeof *SIZES };

Test(cpu_batch, adamw_many_equals_single_calls)
{
    for (int th = 1; th <= 2; th++) {
        omp_set_num_threads(th);
        KTensor p[2][NS], g[NS], m[2][NS], v[2][NS], coef[NS];
        KTensor lr = rnd(KT_F32, 0, NULL, 1e-3f, 1e-2f), step = ten(KT_I32, 0, NULL);
        *(int32_t *)step.data = 3;
        KCall k[2][NS];
        for (int i = 0; i < NS; i++) {
            int64_t sh[1] = {SIZES[i]};
            p[0][i] = rnd(KT_F32, 1, sh, -1, 1), m[0][i] = rnd(KT_F32, 1, sh, -0.1f, 0.1f);
            v[0][i] = rnd(KT_F32, 1, sh, 0, 0.01f);
            g[i] = rnd(i == 2 ? KT_BF16 : KT_F32, 1, sh, -1, 1);  // one 16-bit gradient
            p[1][i] = copy(&p[0][i]), m[1][i] = copy(&m[0][i]), v[1][i] = copy(&v[0][i]);
            coef[i] = ten(KT_F32, 0, NULL);
            *(float *)coef[i].data = i == 4 ? NAN : 0.75f;  // call 4's step is skipped
            for (int r = 0; r < 2; r++)
                k[r][i] = (KCall){.n_in = 7, .in = {p[r][i], g[i], m[r][i], v[r][i], lr, coef[i], step},
                                  .attr = {[7] = 0.9, [8] = 0.95, [9] = 1e-8, [10] = 0.1}};
        }
        for (int i = 0; i < NS; i++) cpu_adamw(&k[0][i]);
        const KCall *many[NS];
        for (int i = 0; i < NS; i++) many[i] = &k[1][i];
        int64_t first[NS + 1];
        cpu_adamw_many(many, NS, first);
        for (int i = 0; i < NS; i++) {
            expect_same(&p[1][i], &p[0][i], "p", th);
            expect_same(&m[1][i], &m[0][i], "m", th);
            expect_same(&v[1][i], &v[0][i], "v", th);
        }
        cr_expect(!memcmp(p[1][4].data, p[0][4].data, 4) && first[5] == first[4], "the skipped call has no tasks");
    }
}

/* ---- the executor: whole plans, batched and op by op ---------------------------------- */

/* Steps of plan p on the built-in data, batched or one_by_one, at `th` threads: the
 * losses, and every persistent tensor's bytes after them (into state, *n bytes). With
 * spans, the last step's ops that took no time of their own (members of a run) by op
 * name: adamw (or adamw_cast) and the rest (a fused group's). */
static void run_steps(const Plan *p, int one_by_one, int th, float *loss, uint8_t *state, size_t *n, int *quiet)
{
    enum { STEPS = 3 };
    char err[512];
    rt_set_threads(th);
    Exec *e = rt_exec_new(p, &(ExecOptions){.seed = 7, .one_by_one = one_by_one}, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    RtData *d = rt_data_open(e, NULL, RT_ORDER_SEQUENTIAL, 7, err, sizeof err);
    cr_assert_not_null(d, "%s", err);
    RtSpan *spans = calloc((size_t)p->n_ops + 1, sizeof *spans);
    RtTensor lt;
    rt_exec_tensor_id(e, p->outputs[0], &lt);
    for (int s = 1; s <= STEPS; s++) {
        if (s == STEPS) rt_exec_time(e, spans);
        rt_data_fill(d, s);
        cr_assert_eq(rt_exec_run(e, s, RT_PHASES_ALL), 0);
        loss[s - 1] = *(float *)lt.data;
    }
    rt_exec_time(e, NULL);
    for (int i = 0; i < 2; i++) quiet[i] = 0;
    for (int32_t k = 0; k < p->n_ops; k++) {
        const char *op = plan_str(p, p->ops[k].op);
        if (spans[k].dur != 0 || (op_info(op_lookup(op))->flags & OPF_VIEW)) continue;
        quiet[strcmp(op, "adamw") != 0 && strcmp(op, "adamw_cast") != 0]++;
    }
    *n = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        if (!plan_tensor_is_persistent(&p->tensors[i]) || p->tensors[i].alias != PLAN_NONE) continue;
        RtTensor t;
        rt_exec_tensor_id(e, i, &t);
        size_t b = (size_t)plan_tensor_nbytes(&p->tensors[i]);
        memcpy(state + *n, t.data, b);
        *n += b;
    }
    free(spans);
    rt_data_close(d);
    rt_exec_free(e);
}

/* fused: whether the plan has fused groups big enough to run as one region (B T C > PAR_MIN). */
static void same_as_one_by_one(const char *file, const Define *defs, int n_defs, const Setting *set, int n_set,
                               int fused)
{
    Plan *p = sample_compile(file, defs, n_defs, set, n_set, NULL);
    size_t cap = (size_t)(plan_space_bytes(p, PLAN_PLACE_DEVICE) + plan_space_bytes(p, PLAN_PLACE_HOST));
    uint8_t *a = malloc(cap), *b = malloc(cap);
    cr_assert(a && b);
    for (int th = 1; th <= 2; th++) {
        float la[3], lb[3];
        size_t na, nb;
        int qa[2], qb[2];
        run_steps(p, 0, th, la, a, &na, qa);
        run_steps(p, 1, th, lb, b, &nb, qb);
        cr_expect(!memcmp(la, lb, sizeof la), "%s at %d threads: losses %.9g %.9g %.9g, one by one %.9g %.9g %.9g",
                  file, th, la[0], la[1], la[2], lb[0], lb[1], lb[2]);
        cr_expect(na == nb && na > 0 && !memcmp(a, b, na), "%s at %d threads: params and state differ", file, th);
        cr_expect(qa[0] > 0 && (qa[1] > 0) == fused, "%s: runs of adamw (%d) and fused ops (%d)", file, qa[0], qa[1]);
        cr_expect(qb[0] + qb[1] == 0, "one by one, every op has its own span");
    }
    free(a), free(b);
    plan_free(p);
}

Test(cpu_batch, gpt2_steps_equal_one_by_one)
{
    Define defs[] = {{"L", 2}, {"C", 192}, {"NH", 4}, {"T", 64}, {"V", 512}, {"B", 4}};  // B T C > PAR_MIN
    /* With its biases and GELUs as ops of their own (no GEMM epilogues): fused elementwise groups. */
    Setting set[] = {{"clip", "1.0"}, {"fuse_gemm", "0"}};
    same_as_one_by_one("gpt2.fsm", defs, 6, set, 2, 1);
    /* With them (the default): no elementwise chains left to fuse. */
    Setting bf16[] = {{"clip", "1.0"}, {"precision", "bf16"}};
    same_as_one_by_one("gpt2.fsm", defs, 6, bf16, 2, 0);
}

Test(cpu_batch, llama_steps_equal_one_by_one)
{
    Setting set[] = {{"clip", "1.0"}};
    same_as_one_by_one("llama.fsm", SAMPLE_LLAMA, 7, set, 1, 0);
}
