/* tests/cuda/test_cuda_schedule.c: the CUDA backend's decisions about a plan, checked
 * without a GPU (runtime/cuda/schedule.c): the row-major GEMM as cuBLAS's column-major
 * call (against a model of cuBLAS's strided-batched GEMM run on the host), NCCL's forms
 * of each collective, which ops wait for which collective, where each op's
 * instructions are, offload's copies and host ops, and how an op is named in messages.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "schedule.h"

/* ---- building small plans ------------------------------------------------------------ */

static int32_t tensor(Plan *p, const char *name, PlanDType dt, int64_t numel, int64_t offset)
{
    PlanTensor t = {.name = plan_intern(p, name), .dtype = dt, .role = PLAN_ROLE_ACT, .rank = 1, .shape = {numel},
                    .block = PLAN_NONE, .producer = PLAN_NONE, .tied_to = PLAN_NONE, .grad = PLAN_NONE,
                    .offset = offset, .live_end = p->n_ops + 8, .alias = PLAN_NONE, .unit = PLAN_NONE};
    return plan_tensor_add(p, &t);
}

/* A view of root's bytes from byte `at`; rank r's part lies rank_stride bytes further. */
static int32_t view(Plan *p, const char *name, int32_t root, int64_t at, int64_t numel, int64_t rank_stride)
{
    PlanTensor t = p->tensors[root];
    t.name = plan_intern(p, name), t.shape[0] = numel, t.alias = root, t.offset += at, t.rank_stride = rank_stride;
    return plan_tensor_add(p, &t);
}

/* An op reading `in` and writing `out` (-1: none; its producer becomes this op), with
 * int attributes. */
static int32_t op(Plan *p, const char *name, int32_t in, int32_t out, const char *k1, int64_t v1, const char *k2,
                  int64_t v2)
{
    PlanOp o = {.op = plan_intern(p, name), .block = PLAN_NONE, .phase = PLAN_PHASE_FORWARD, .line = 7, .col = 3,
                .in = p->n_ids, .attr = p->n_attrs};
    if (in >= 0) plan_id_add(p, in), o.n_in = 1;
    o.out = p->n_ids;
    if (out >= 0) plan_id_add(p, out), o.n_out = 1;
    const char *keys[] = {k1, k2};
    const int64_t vals[] = {v1, v2};
    for (int i = 0; i < 2; i++)
        if (keys[i]) {
            PlanAttr a = {.key = plan_intern(p, keys[i]), .kind = PLAN_ATTR_INT, .i = vals[i]};
            plan_attr_add(p, &a);
            o.n_attr++;
        }
    int32_t id = plan_op_add(p, &o);
    if (out >= 0) p->tensors[out].producer = id;
    return id;
}

static void launch(Plan *p, int32_t k, const int32_t *args, int n)
{
    PlanCuda c = {.op = k, .kind = PLAN_CU_LAUNCH, .kernel = plan_intern(p, "fs_k_00000001"), .args = p->n_ids,
                  .n_args = n, .grid = {1, 1, 1}, .block = {32, 1, 1}};
    for (int i = 0; i < n; i++) plan_id_add(p, args[i]);
    cr_assert_geq(plan_cuda_add(p, &c), 0);
}

static void checked(const Plan *p)
{
    char err[256];
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
}

/* ---- GEMM: row-major as torch.matmul, through cuBLAS's column-major form --------------- */

static double elem(const float *arena, int64_t byte_off, int64_t i) { return arena[byte_off / 4 + i]; }

/* What the plan means: C_b = op(A_b) @ op(B_b), row-major. */
static void row_major_ref(const float *arena, const Plan *p, const PlanCuda *c, double *out)
{
    int64_t A = p->tensors[p->ids[c->args]].offset, B = p->tensors[p->ids[c->args + 1]].offset;
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t i = 0; i < c->m; i++)
            for (int64_t j = 0; j < c->n; j++) {
                double s = 0;
                for (int64_t l = 0; l < c->k; l++) {
                    int64_t ai = c->a_off + b * c->stride_a + (c->ta ? l * c->lda + i : i * c->lda + l);
                    int64_t bi = c->b_off + b * c->stride_b + (c->tb ? j * c->ldb + l : l * c->ldb + j);
                    s += elem(arena, A, ai) * elem(arena, B, bi);
                }
                out[(b * c->m + i) * c->n + j] = s;
            }
}

/* What cuBLAS computes for cublasGemmStridedBatchedEx with alpha 1, beta 0 (column-major:
 * element (r, c) of X with leading dimension ld is X[r + c * ld]), written into mem. */
static void cublas_model(const float *arena, const CsGemm *g, double *mem)
{
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t r = 0; r < g->m; r++)
            for (int64_t col = 0; col < g->n; col++) {
                double s = 0;
                for (int64_t l = 0; l < g->k; l++) {
                    int64_t ai = b * g->stride_a + (g->trans_a ? l + r * g->lda : r + l * g->lda);
                    int64_t bi = b * g->stride_b + (g->trans_b ? col + l * g->ldb : l + col * g->ldb);
                    s += elem(arena, g->a, ai) * elem(arena, g->b, bi);
                }
                mem[g->c / 4 + b * g->stride_c + r + col * g->ldc] = s;
            }
}

/* The plan's C, row-major, as mem holds it. */
static void read_c(const double *mem, const Plan *p, const PlanCuda *c, double *out)
{
    int64_t base = p->tensors[p->ids[c->args + 2]].offset / 4 + c->c_off;
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t i = 0; i < c->m; i++)
            for (int64_t j = 0; j < c->n; j++)
                out[(b * c->m + i) * c->n + j] = mem[base + b * c->stride_c + i * c->ldc + j];
}

static void check_gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, int64_t batch, int pad, int64_t a_off)
{
    Plan *p = plan_new();
    int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
    int64_t sa = (ta ? k : m) * lda, sb = batch > 2 ? 0 : (tb ? n : k) * ldb, sc = m * ldc;  // sb 0: broadcast
    int64_t na = a_off + batch * sa, nb = (batch > 2 ? 1 : batch) * (tb ? n : k) * ldb, nc = pad + batch * sc;
    int32_t A = tensor(p, "A", PLAN_DT_F32, na, 0), B = tensor(p, "B", PLAN_DT_F32, nb, ((na * 4 + 63) / 64) * 64);
    int32_t C = tensor(p, "C", PLAN_DT_F32, nc, p->tensors[B].offset + ((nb * 4 + 63) / 64) * 64);
    int32_t k0 = op(p, "matmul", A, C, NULL, 0, NULL, 0);
    PlanCuda g = {.op = k0, .kind = PLAN_CU_GEMM, .kernel = PLAN_NONE, .args = p->n_ids, .n_args = 3, .ta = ta,
                  .tb = tb, .m = m, .n = n, .k = k, .lda = lda, .ldb = ldb, .ldc = ldc, .stride_a = sa, .stride_b = sb,
                  .stride_c = sc, .batch = batch, .a_off = a_off, .c_off = pad};
    plan_id_add(p, A), plan_id_add(p, B), plan_id_add(p, C);
    plan_cuda_add(p, &g);
    checked(p);
    int64_t words = (p->tensors[C].offset / 4) + nc;
    float *arena = malloc(sizeof *arena * (size_t)words);
    for (int64_t i = 0; i < words; i++) arena[i] = (float)((i * 7919 % 23) - 11) / 8.0f;
    CsGemm cg;
    cs_gemm(p, 0, 0, &cg);
    cr_assert_eq(cg.a, p->tensors[B].offset, "cuBLAS's A is the plan's B");
    cr_assert_eq(cg.b, p->tensors[A].offset + a_off * 4, "cuBLAS's B is the plan's A, offset applied");
    cr_assert_eq(cg.c, p->tensors[C].offset + pad * 4, "C with its offset applied");
    cr_assert(cg.m == n && cg.n == m && cg.k == k && cg.batch == batch);
    cr_assert(cg.lda >= (cg.trans_a ? cg.k : cg.m) && cg.ldb >= (cg.trans_b ? cg.n : cg.k) && cg.ldc >= cg.m,
              "cuBLAS's leading dimensions must cover its rows");
    size_t n_out = (size_t)(batch * m * n);
    double *want = malloc(sizeof *want * n_out), *got = malloc(sizeof *got * n_out);
    double *mem = malloc(sizeof *mem * (size_t)words);
    for (int64_t i = 0; i < words; i++) mem[i] = NAN;  // what cuBLAS does not write stays NaN
    row_major_ref(arena, p, &p->cuda[0], want);
    cublas_model(arena, &cg, mem);
    read_c(mem, p, &p->cuda[0], got);
    free(mem);
    for (size_t i = 0; i < n_out; i++)
        cr_assert_float_eq(got[i], want[i], 1e-9, "ta %d tb %d m %lld n %lld k %lld batch %lld: element %zu", ta, tb,
                           (long long)m, (long long)n, (long long)k, (long long)batch, i);
    free(arena), free(want), free(got);
    plan_free(p);
}

Test(cuda_schedule, gemm_row_major_as_column_major)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            check_gemm(ta, tb, 3, 5, 4, 1, 0, 0);
            check_gemm(ta, tb, 1, 7, 2, 2, 3, 5);   // row strides past the row, an offset into A
            check_gemm(ta, tb, 6, 1, 3, 3, 1, 0);   // B broadcast over the batch (stride 0)
        }
}

/* ---- collectives ----------------------------------------------------------------------- */

static int build(const Plan *p, int rank, int world, CsSchedule *s, char *err)
{
    checked(p);
    return cs_build(p, rank, world, s, err, 256);
}

Test(cuda_schedule, collective_forms)
{
    Plan *p = plan_new();
    int32_t g = tensor(p, "g", PLAN_DT_F32, 16, 0), sh = tensor(p, "sh", PLAN_DT_F32, 4, 128),
            h = tensor(p, "h", PLAN_DT_F32, 16, 192);
    int32_t r = view(p, "g.reduced", g, 0, 16, 0);
    int32_t gv = view(p, "g.shard", g, 0, 4, 16);   // rank r's quarter of g: g + r * 16 bytes
    int32_t hv = view(p, "h.shard", h, 0, 4, 16);
    int32_t hg = view(p, "h.gathered", h, 0, 16, 0);
    op(p, "all_reduce", g, r, "world", 4, "avg", 1);           // in place
    op(p, "reduce_scatter", g, gv, "world", 4, "avg", 1);      // into this rank's slice: NCCL in place
    op(p, "reduce_scatter", g, sh, "world", 4, NULL, 0);       // out of place
    op(p, "all_gather", hv, hg, "world", 4, NULL, 0);          // from this rank's slice: NCCL in place
    CsSchedule s;
    char err[256];
    cr_assert_eq(build(p, 2, 4, &s, err), 0, "%s", err);
    cr_assert_eq(s.n_colls, 4);
    cr_assert(s.colls[0].kind == CS_ALL_REDUCE && s.colls[0].avg && s.colls[0].count == 16 && s.colls[0].in == 0 &&
              s.colls[0].nccl_out == 0 && !s.colls[0].move);
    cr_assert(s.colls[1].kind == CS_REDUCE_SCATTER && s.colls[1].count == 4 && s.colls[1].out == 32 &&
              s.colls[1].nccl_out == 32 && !s.colls[1].move, "rank 2's slice starts 32 bytes in");
    cr_assert(s.colls[2].nccl_out == 128 && !s.colls[2].avg && s.colls[2].out_bytes == 16);
    cr_assert(s.colls[3].kind == CS_ALL_GATHER && s.colls[3].count == 4 && s.colls[3].in == 192 + 32 &&
              s.colls[3].out == 192);
    for (int k = 0; k < 4; k++) cr_assert_eq(s.ops[k].coll, k);
    cs_free(&s);
    plan_free(p);
}

Test(cuda_schedule, reduce_scatter_to_the_start_moves_after)
{
    Plan *p = plan_new();
    int32_t g = tensor(p, "g", PLAN_DT_F32, 16, 0);
    int32_t head = view(p, "g.head", g, 0, 4, 0);  // MPI's in-place result: the start of x
    op(p, "reduce_scatter", g, head, "world", 4, NULL, 0);
    CsSchedule s;
    char err[256];
    cr_assert_eq(build(p, 3, 4, &s, err), 0, "%s", err);
    cr_assert(s.colls[0].move && s.colls[0].nccl_out == 48 && s.colls[0].out == 0);
    cs_free(&s);
    cr_assert_eq(build(p, 0, 4, &s, err), 0, "%s", err);  // rank 0's slice is the start: in place
    cr_assert(!s.colls[0].move && s.colls[0].nccl_out == 0);
    cs_free(&s);
    plan_free(p);
}

Test(cuda_schedule, collectives_refused)
{
    Plan *p = plan_new();
    int32_t g = tensor(p, "g", PLAN_DT_F32, 32, 0);
    int32_t head = view(p, "g.head", g, 0, 16, 0), mid = view(p, "g.mid", g, 8, 16, 0);
    op(p, "all_reduce", head, mid, "world", 2, NULL, 0);
    CsSchedule s;
    char err[256];
    cr_assert_eq(build(p, 0, 2, &s, err), -1);
    cr_assert(strstr(err, "op 0 (all_reduce) on rank 0: its output overlaps its input without being it"), "%s", err);
    cr_assert_eq(build(p, 0, 4, &s, err), -1);
    cr_assert(strstr(err, "is for a world of 2 ranks, but this run has 4"), "%s", err);
    plan_free(p);

    p = plan_new();
    int32_t n = tensor(p, "n", PLAN_DT_I32, 4, 0), m = tensor(p, "m", PLAN_DT_I32, 4, 64);  // distinct: out of place
    op(p, "all_reduce", n, m, "world", 2, "avg", 1);
    cr_assert_eq(build(p, 0, 2, &s, err), -1);
    cr_assert(strstr(err, "an average of i32 elements"), "%s", err);
    plan_free(p);
}

/* ---- which op waits for which collective ------------------------------------------------ */

/* The schedule is the plan's (passes/schedule.c): the backend (and the emulator, which
 * runs through cs_build) takes its waits as stored, and refuses a plan whose stored
 * schedule would let an op touch a collective's bytes in flight: a missing wait. */
Test(cuda_schedule, stored_waits_run_and_a_missing_one_is_refused)
{
    Plan *p = plan_new();
    int32_t x = tensor(p, "x", PLAN_DT_F32, 16, 0), g = tensor(p, "g", PLAN_DT_F32, 16, 64),
            t = tensor(p, "t", PLAN_DT_F32, 16, 128), y = tensor(p, "y", PLAN_DT_F32, 16, 192);
    int32_t gr = view(p, "g.reduced", g, 0, 16, 0), t2 = view(p, "t2", t, 0, 16, 0), yv = view(p, "y.v", y, 0, 16, 0);
    int32_t k0 = op(p, "mul", x, g, NULL, 0, NULL, 0);
    op(p, "all_reduce", g, gr, "world", 2, "avg", 1);
    int32_t k2 = op(p, "neg", x, t, NULL, 0, NULL, 0);         // other bytes: runs alongside
    int32_t k3 = op(p, "add", gr, y, NULL, 0, NULL, 0);        // reads g's bytes: waits
    int32_t k4 = op(p, "exp", gr, t2, NULL, 0, NULL, 0);       // already waited for
    op(p, "reshape", y, yv, NULL, 0, NULL, 0);                 // no instructions: no work, no wait
    launch(p, k0, (int32_t[]){x, g}, 2);
    launch(p, k2, (int32_t[]){x, t}, 2);
    launch(p, k3, (int32_t[]){gr, y}, 2);
    launch(p, k3, (int32_t[]){y, y}, 2);                       // a second instruction of op 3
    launch(p, k4, (int32_t[]){gr, t2}, 2);
    p->ops[1].stream = PLAN_STREAM_COLLECTIVE;
    CsSchedule s;
    char err[256];
    cr_assert_eq(build(p, 0, 2, &s, err), -1, "a plan without the wait runs");
    cr_assert(strstr(err, "the schedule is unsafe on rank 0: op 3 (add)"), "%s", err);
    cr_assert(strstr(err, "touches the bytes of op 1 (all_reduce, on the collective stream)"), "%s", err);
    p->ops[3].wait = plan_wait_add(p, 1), p->ops[3].n_wait = 1;  // what the schedule pass stores
    cr_assert_eq(build(p, 0, 2, &s, err), 0, "%s", err);
    cr_assert(s.ops[0].n_instr == 1 && s.ops[0].instr == 0 && s.ops[3].n_instr == 2 && s.ops[3].instr == 2);
    cr_assert(s.ops[1].n_instr == 0 && s.ops[5].n_instr == 0);
    cr_assert_eq(s.ops[2].n_wait, 0);
    cr_assert_eq(s.ops[3].n_wait, 1);
    cr_assert_eq(s.waits[s.ops[3].wait], 0);
    cr_assert_eq(s.ops[4].n_wait, 0);
    cr_assert_eq(s.args[s.arg_at[3]], 192, "the second instruction of op 3 reads y at 192");
    cs_free(&s);
    /* World 1: collectives are copies on the compute stream; nobody waits for an event. */
    PlanAttr *w = &p->attrs[p->ops[1].attr];
    w->i = 1;
    cr_assert_eq(build(p, 0, 1, &s, err), 0, "%s", err);
    for (int32_t k = 0; k < s.n_ops; k++) cr_assert_eq(s.ops[k].n_wait, 0);
    cs_free(&s);
    plan_free(p);
}

Test(cuda_schedule, op_where)
{
    Plan *p = plan_new();
    int32_t x = tensor(p, "x", PLAN_DT_F32, 4, 0), y = tensor(p, "y", PLAN_DT_F32, 4, 64);
    op(p, "softmax", x, y, NULL, 0, NULL, 0);
    char buf[128];
    cs_op_where(p, 0, buf, sizeof buf);
    cr_assert_str_eq(buf, "op 0 (softmax) at 7:3");
    plan_meta_set_str(p, "source", "gpt2.fsm");
    cs_op_where(p, 0, buf, sizeof buf);
    cr_assert_str_eq(buf, "op 0 (softmax) at gpt2.fsm:7:3");
    cr_assert_eq(cs_offset(p, x, 3), 0);
    cr_assert_eq(cs_coll_kind("all_gather"), CS_ALL_GATHER);
    cr_assert_eq(cs_coll_kind("softmax"), -1);
    plan_free(p);
}

/* ---- offload: copies between the arena and the host space, ops of the host space -------- */

static int32_t on_host(Plan *p, int32_t t)
{
    p->tensors[t].place = PLAN_PLACE_HOST;
    return t;
}

Test(cuda_schedule, offload_copies_and_host_ops)
{
    Plan *p = plan_new();
    int32_t x = tensor(p, "x", PLAN_DT_F32, 16, 0), g = tensor(p, "g", PLAN_DT_F32, 16, 64);
    int32_t gh = on_host(p, tensor(p, "g.host", PLAN_DT_F32, 16, 128)), nh = on_host(p, tensor(p, "n.host", PLAN_DT_F32, 16, 0));
    int32_t d = tensor(p, "n.device", PLAN_DT_F32, 16, 192);
    int32_t k0 = op(p, "neg", x, g, NULL, 0, NULL, 0);
    launch(p, k0, (const int32_t[]){x, g}, 2);
    op(p, "to_host", g, gh, NULL, 0, NULL, 0);
    int32_t k2 = op(p, "neg", gh, nh, NULL, 0, NULL, 0);
    op(p, "to_device", nh, d, NULL, 0, NULL, 0);
    CsSchedule s;
    char err[256];
    /* On the copy stream, the down copy is in flight until the host op that reads it says it waits. */
    p->ops[1].stream = p->ops[3].stream = PLAN_STREAM_COPY;
    cr_assert_eq(build(p, 0, 1, &s, err), -1, "a host op reads a copy in flight");
    cr_expect(strstr(err, "op 2 (neg)") && strstr(err, "touches the bytes of op 1 (to_host, on the copy stream)"), "%s", err);
    p->ops[2].wait = plan_wait_add(p, 1), p->ops[2].n_wait = 1;
    cr_assert_eq(build(p, 0, 1, &s, err), 0, "%s", err);
    cr_expect(s.ops[2].n_wait == 1 && s.waits[s.ops[2].wait] == s.n_colls + 0, "the wait is the copy's event");
    cr_expect_eq(s.n_copies, 2);
    cr_expect_eq(s.n_host, 1);
    cr_expect(s.ops[1].copy == 0 && s.ops[3].copy == 1 && s.ops[0].copy < 0 && s.ops[2].copy < 0);
    cr_expect(s.ops[2].host && !s.ops[0].host && !s.ops[1].host && !s.ops[3].host);
    const CsCopy *down = &s.copies[0], *up = &s.copies[1];
    cr_expect(!down->to_device && down->dev == 64 && down->host == 128 && down->bytes == 64);
    cr_expect(up->to_device && up->dev == 192 && up->host == 0 && up->bytes == 64);
    cs_free(&s);
    launch(p, k2, (const int32_t[]){gh, nh}, 2);  // an op of the host space with a kernel: another fsc's plan
    cr_assert_eq(build(p, 0, 1, &s, err), -1);
    cr_expect(strstr(err, "op 2 (neg) runs on the host but has CUDA instructions"), "%s", err);
    plan_free(p);
}
