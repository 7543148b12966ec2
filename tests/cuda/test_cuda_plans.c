/* tests/cuda/test_cuda_plans.c: the CUDA backend's schedule (runtime/cuda/schedule.c)
 * on the samples' real plans, as fsc makes them, without a GPU: tiny GPT-2 and Llama
 * under every sharding strategy, on every rank, in fp32 and bf16. Each schedule must
 * build (every collective in a form NCCL runs), every byte an op's work touches must
 * lie in the arena, and the waits must be enough: whenever an op's work touches the
 * bytes of a collective started before it, it or an earlier op waited for that
 * collective. And the plan's module compiles through the backend's JIT (jit.c).
 * Plans without a CUDA program (a build whose codegen does not make one) are skipped.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit.h"
#include "sample.h"
#include "schedule.h"

static int overlap(CsRange a, CsRange b) { return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi; }

static CsRange tensor_bytes(const Plan *p, int32_t id, int rank)
{
    int64_t lo = cs_offset(p, id, rank);
    return (CsRange){lo, lo + plan_tensor_nbytes(&p->tensors[id])};
}

/* The bytes op k's work touches on `rank`, as the test sees them: a collective's input and
 * output; an op with instructions its inputs, outputs and every instruction's arguments (a
 * fused group's one launch reads the inputs of all its members); a view, nothing. Into
 * out (malloc'ed); the count. */
static int touched(const Plan *p, const CsSchedule *s, int32_t k, int rank, CsRange **out)
{
    const PlanOp *op = &p->ops[k];
    const CsOp *o = &s->ops[k];
    int n = 0, cap = op->n_in + op->n_out + 2;
    for (int32_t i = o->instr; i < o->instr + o->n_instr; i++) cap += p->cuda[i].n_args;
    CsRange *r = *out = malloc(sizeof *r * (size_t)cap);
    if (o->coll >= 0) {
        r[n++] = s->colls[o->coll].range[0];
        r[n++] = s->colls[o->coll].range[1];
    } else if (o->n_instr) {
        for (int32_t i = 0; i < op->n_in; i++) r[n++] = tensor_bytes(p, p->ids[op->in + i], rank);
        for (int32_t i = 0; i < op->n_out; i++) r[n++] = tensor_bytes(p, p->ids[op->out + i], rank);
        for (int32_t i = o->instr; i < o->instr + o->n_instr; i++)
            for (int32_t a = 0; a < p->cuda[i].n_args; a++) r[n++] = tensor_bytes(p, p->ids[p->cuda[i].args + a], rank);
    }
    return n;
}

/* Every byte an op's work touches lies in the arena, and the waits are enough: an op
 * touching a started collective's bytes has it waited for. */
static void check_waits(const Plan *p, const CsSchedule *s, const char *what, int rank)
{
    int64_t arena = plan_space_bytes(p, PLAN_PLACE_DEVICE);
    char *waited = calloc((size_t)s->n_colls + 1, 1);
    for (int32_t k = 0; k < s->n_ops; k++) {
        const CsOp *o = &s->ops[k];
        CsRange *t;
        int n = touched(p, s, k, rank, &t);
        for (int i = 0; i < n; i++)
            cr_assert(t[i].lo >= 0 && t[i].hi <= arena, "%s rank %d: bytes [%lld, %lld) outside the arena", what, rank,
                      (long long)t[i].lo, (long long)t[i].hi);
        for (int32_t w = 0; w < o->n_wait; w++) waited[s->waits[o->wait + w]] = 1;
        for (int32_t c = 0; c < s->n_colls && s->colls[c].op < k && o->coll < 0; c++)
            for (int i = 0; i < n; i++)
                cr_assert(waited[c] || (!overlap(t[i], s->colls[c].range[0]) && !overlap(t[i], s->colls[c].range[1])),
                          "%s rank %d: op %d touches collective %d (op %d) without waiting for it", what, rank, k, c,
                          s->colls[c].op);
        free(t);
    }
    free(waited);
}

static void check(const char *file, const Define *defs, int n_defs, const char *shard, const char *world,
                  const char *precision)
{
    Setting set[] = {{"shard", shard}, {"world", world}, {"precision", precision}};
    Plan *p = sample_compile(file, defs, n_defs, set, 3, NULL);
    char what[128], err[512];
    snprintf(what, sizeof what, "%s %s world %s %s", file, shard, world, precision);
    if (!p->n_cuda) {
        plan_free(p);
        cr_skip_test("%s: the plan has no CUDA program (codegen makes none in this build)", what);
    }
    int w = atoi(world);
    for (int rank = 0; rank < w; rank++) {
        CsSchedule s;
        cr_assert_eq(cs_build(p, rank, w, &s, err, sizeof err), 0, "%s rank %d: %s", what, rank, err);
        for (int32_t c = 0; c < s.n_colls; c++) cr_assert_gt(s.colls[c].count, 0);
        if (w == 1)
            for (int32_t k = 0; k < s.n_ops; k++) cr_assert_eq(s.ops[k].n_wait, 0, "%s: a wait at world 1", what);
        else
            cr_assert_gt(s.n_colls, 0, "%s: a world of %d ranks without collectives", what, w);
        check_waits(p, &s, what, rank);
        cs_free(&s);
    }
    plan_free(p);
}

Test(cuda_plans, every_strategy_every_rank)
{
    const char *strategies[][2] = {{"none", "1"}, {"ddp", "2"}, {"zero1", "4"}, {"zero2", "2"}, {"fsdp", "4"}};
    Define gpt2[6], llama[7];
    memcpy(gpt2, SAMPLE_GPT2, sizeof gpt2);
    memcpy(llama, SAMPLE_LLAMA, sizeof llama);
    gpt2[5].value = llama[6].value = 8;  // B: a batch every world divides
    for (size_t i = 0; i < sizeof strategies / sizeof *strategies; i++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            const char *prec = bf16 ? "bf16" : "fp32";
            check("gpt2.fsm", gpt2, 6, strategies[i][0], strategies[i][1], prec);
            check("llama.fsm", llama, 7, strategies[i][0], strategies[i][1], prec);
        }
}

Test(cuda_plans, module_compiles_through_the_jit)
{
    Setting set[] = {{"precision", "bf16"}};
    Plan *p = sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, set, 1, NULL);
    if (!p->n_cuda) {
        plan_free(p);
        cr_skip_test("the plan has no CUDA program (codegen makes none in this build)");
    }
    JitImage im;
    char err[2048];
    cr_assert_eq(jit_compile(plan_meta_str(p, "cuda_source", ""), "sm_90", "", &im, err, sizeof err), 0, "%s", err);
    cr_assert(im.size > 0 && !memcmp(im.image, "\177ELF", 4));
    jit_free(&im);
    plan_free(p);
}

/* Hybrid sharding, zero2 shard_group 2 of world 4: each rank binds its views at its index
 * in its shard group (ranks 0 and 2, 1 and 3 alike, collectives and kernels' args), its gathers and reduce-scatters
 * over the shard group of 2 and its gradient shards' all-reduces over the replica
 * group of 2, averaged over all 4 ranks (NCCL's premultiplied sum). */
Test(cuda_plans, hybrid_groups)
{
    Define gpt2[6];
    memcpy(gpt2, SAMPLE_GPT2, sizeof gpt2);
    gpt2[5].value = 8;
    Setting set[] = {{"shard", "zero2"}, {"world", "4"}, {"shard_group", "2"}};
    Plan *p = sample_compile("gpt2.fsm", gpt2, 6, set, 3, NULL);
    if (!p->n_cuda) {
        plan_free(p);
        cr_skip_test("the plan has no CUDA program (codegen makes none in this build)");
    }
    CsSchedule s[4];
    char err[512];
    for (int rank = 0; rank < 4; rank++) {
        cr_assert_eq(cs_build(p, rank, 4, &s[rank], err, sizeof err), 0, "rank %d: %s", rank, err);
        cr_assert_eq(s[rank].shard, 2);
        check_waits(p, &s[rank], "gpt2 zero2 shard_group 2", rank);
    }
    int shard = 0, replica = 0, strided = 0;
    for (int32_t c = 0; c < s[0].n_colls; c++) {
        const CsColl *x = &s[0].colls[c];
        shard += x->group == OP_GROUP_SHARD, replica += x->group == OP_GROUP_REPLICA;
        if (x->group == OP_GROUP_REPLICA) cr_assert(x->kind == CS_ALL_REDUCE && x->avg && x->avg_over == 4);
        if (x->group == OP_GROUP_SHARD && x->kind == CS_REDUCE_SCATTER) cr_assert_eq(x->avg, 0, "summed, averaged later");
        strided += s[1].colls[c].in != x->in;  // zero2's gathers read this rank's shard of the full params
        for (int rank = 2; rank < 4; rank++) {
            const CsColl *y = &s[rank].colls[c], *z = &s[rank % 2].colls[c];
            cr_assert(y->in == z->in && y->out == z->out && y->nccl_out == z->nccl_out, "collective %d on rank %d", c, rank);
        }
    }
    cr_assert(shard > 0 && replica > 0 && strided > 0, "%d collectives in the shard group, %d in the replica group, %d "
              "at a rank's own shard", shard, replica, strided);
    for (int32_t i = 0; i < p->n_cuda; i++)
        for (int rank = 2; rank < 4; rank++) {
            const CsSchedule *y = &s[rank], *z = &s[rank % 2];
            if (p->cuda[i].kind == PLAN_CU_GEMM) {
                cr_assert(y->gemms[i].a == z->gemms[i].a && y->gemms[i].b == z->gemms[i].b && y->gemms[i].c == z->gemms[i].c,
                          "GEMM %d on rank %d", i, rank);
                continue;
            }
            for (int32_t a = 0; a < p->cuda[i].n_args; a++)
                cr_assert_eq(y->args[y->arg_at[i] + a], z->args[z->arg_at[i] + a], "LAUNCH %d arg %d on rank %d", i, a, rank);
        }
    for (int rank = 0; rank < 4; rank++) cs_free(&s[rank]);
    plan_free(p);
}

/* The sends and receives of stage g (program p) on data-parallel index d: each bound to
 * its link and its peer's rank (stage * dp + d). */
static void check_p2p(const Plan *p, const CsSchedule *s, int g, int d, int dp, const char *what)
{
    for (int32_t c = 0; c < s->n_colls; c++) {
        const CsColl *x = &s->colls[c];
        if (x->kind != CS_SEND && x->kind != CS_RECV) {
            cr_assert_lt(x->link, 0, "%s: a collective on a link", what);
            continue;
        }
        cr_assert(x->link >= 0 && x->link < s->n_links && x->async, "%s stage %d: op %d has no link", what, g, x->op);
        const CsLink *l = &s->links[x->link];
        cr_assert_eq(l->send, x->kind == CS_SEND);
        cr_assert_eq(x->peer, l->stage * dp + d, "%s stage %d op %d: peer rank %d, link to stage %d", what, g, x->op,
                     x->peer, l->stage);
        cr_assert_eq(x->in_bytes, plan_tensor_nbytes(&p->tensors[p->ids[x->kind == CS_SEND ? p->ops[x->op].in
                                                                                         : p->ops[x->op].out]]));
    }
}

/* Pipelines on CUDA ranks: every stage's program of 1F1B and interleaved (2 chunks, whose
 * sends carry the chunk as their tag) plans, 2 stages x 2 data-parallel ranks under
 * zero2, binds on every rank, its waits enough; every send and receive on a link, and the
 * two ends of each link agree: the k-th send of stage a to b with tag t has the bytes of
 * the k-th receive of b from a with tag t (what plan_check_p2p pairs), so NCCL's queue
 * of the link meets them in that order. */
Test(cuda_plans, pipeline_links)
{
    Define gpt2[6];
    memcpy(gpt2, SAMPLE_GPT2, sizeof gpt2);
    gpt2[0].value = 4, gpt2[5].value = 8;  // L: 2 stages x 2 chunks; B: 2 ranks x 4 micro-batches
    const char *scheds[][2] = {{"1f1b", "1"}, {"interleaved", "2"}};
    for (int k = 0; k < 2; k++) {
        Setting set[] = {{"shard", "zero2"}, {"world", "4"}, {"stages", "2"}, {"microbatches", "4"},
                         {"schedule", scheds[k][0]}, {"chunks", scheds[k][1]}};
        Plan *whole = sample_compile("gpt2.fsm", gpt2, 6, set, 6, NULL);
        char err[512], what[64];
        snprintf(what, sizeof what, "gpt2 %s 2 stages x 2", scheds[k][0]);
        cr_assert_eq(whole->n_programs, 2);
        Plan *one[2];
        CsSchedule s[2][2];
        for (int g = 0; g < 2; g++) {
            cr_assert(one[g] = plan_extract_program(whole, g, err, sizeof err), "%s", err);
            for (int d = 0; d < 2; d++) {
                cr_assert_eq(cs_build_stage(one[g], d, 2, g, 2, &s[g][d], err, sizeof err), 0, "%s stage %d: %s", what,
                             g, err);
                check_waits(one[g], &s[g][d], what, d);
                check_p2p(one[g], &s[g][d], g, d, 2, what);
            }
        }
        int sends = 0, tags = 0;
        for (int g = 0; g < 2; g++)
            for (int32_t li = 0; li < s[g][0].n_links; li++) {
                const CsLink *l = &s[g][0].links[li];
                if (!l->send) continue;
                int32_t lj = 0;  // the other end: the peer's link from g with this tag
                while (lj < s[l->stage][0].n_links && !(s[l->stage][0].links[lj].stage == g &&
                                                         !s[l->stage][0].links[lj].send && s[l->stage][0].links[lj].tag == l->tag))
                    lj++;
                cr_assert_lt(lj, s[l->stage][0].n_links, "%s: stage %d's link to %d (tag %lld) has no other end", what, g,
                             l->stage, (long long)l->tag);
                tags += l->tag != 0;
                const CsSchedule *a = &s[g][0], *b = &s[l->stage][0];
                int32_t i = 0, j = 0;
                for (;; i++, j++) {
                    while (i < a->n_colls && a->colls[i].link != li) i++;
                    while (j < b->n_colls && b->colls[j].link != lj) j++;
                    if (i == a->n_colls || j == b->n_colls) break;
                    cr_assert_eq(a->colls[i].in_bytes, b->colls[j].out_bytes, "%s: a send and its receive differ", what);
                    cr_assert_eq(a->colls[i].dtype, b->colls[j].dtype);
                    sends++;
                }
                cr_assert(i == a->n_colls && j == b->n_colls, "%s: stage %d sends to %d more or fewer than it receives",
                          what, g, l->stage);
            }
        cr_assert_gt(sends, 0, "%s: no sends", what);
        if (k == 1) cr_assert_gt(tags, 0, "%s: no link of a chunk's tag", what);
        for (int g = 0; g < 2; g++) {
            for (int d = 0; d < 2; d++) cs_free(&s[g][d]);
            plan_free(one[g]);
        }
        plan_free(whole);
    }
}
