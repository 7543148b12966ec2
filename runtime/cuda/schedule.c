/* runtime/cuda/schedule.c: the CUDA backend's decisions about a plan, made once, before
 * any device call (see schedule.h). Runs on plans that passed plan_check: every id,
 * range and GEMM extent is already known to be sound, so nothing here re-checks them;
 * what is checked is what only the runtime knows (the world, how NCCL can run a
 * collective in place).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "schedule.h"


int64_t cs_offset(const Plan *p, int32_t id, int rank)
{
    const PlanTensor *t = &p->tensors[id];
    return t->offset + (int64_t)rank * t->rank_stride;
}

static int overlap(CsRange a, CsRange b) { return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi; }

/* The op table names the collectives (ops.def's comm column); CsCollKind numbers them
 * as it does. */
_Static_assert((int)CS_ALL_REDUCE == (int)COMM_ALL_REDUCE && (int)CS_REDUCE_SCATTER == (int)COMM_REDUCE_SCATTER &&
                   (int)CS_ALL_GATHER == (int)COMM_ALL_GATHER && (int)CS_SEND == (int)COMM_SEND &&
                   (int)CS_RECV == (int)COMM_RECV,
               "CsCollKind is OpComm's collectives and point-to-point ops");

int cs_coll_kind(const char *op)
{
    OpComm k = op_comm_by_name(op);
    return k >= 0 && k < (int)CS_COLL_COUNT ? (int)k : -1;
}

void cs_gemm(const Plan *p, int32_t i, int rank, CsGemm *g)
{
    const PlanCuda *c = &p->cuda[i];
    int32_t A = p->ids[c->args], B = p->ids[c->args + 1], C = p->ids[c->args + 2];
    int64_t ea = plan_dtype_size(p->tensors[A].dtype), eb = plan_dtype_size(p->tensors[B].dtype),
            ec = plan_dtype_size(p->tensors[C].dtype);
    /* Row-major C[m, n] is column-major C^T[n, m] with leading dimension ldc; likewise
     * the stored A and B. So C^T = op(B)^T op(A)^T: cuBLAS multiplies the stored B (as
     * its A, transposed exactly when the plan's B is) by the stored A. */
    *g = (CsGemm){.trans_a = c->tb, .trans_b = c->ta, .m = (int)c->n, .n = (int)c->m, .k = (int)c->k,
                  .lda = (int)c->ldb, .ldb = (int)c->lda, .ldc = (int)c->ldc, .batch = (int)c->batch,
                  .stride_a = c->stride_b, .stride_b = c->stride_a, .stride_c = c->stride_c,
                  .a = cs_offset(p, B, rank) + c->b_off * eb, .b = cs_offset(p, A, rank) + c->a_off * ea,
                  .c = cs_offset(p, C, rank) + c->c_off * ec,
                  .a_dt = p->tensors[B].dtype, .b_dt = p->tensors[A].dtype, .c_dt = p->tensors[C].dtype};
    static const CsEpilogue lt[PLAN_EPI_COUNT] = {
        [PLAN_EPI_NONE] = CS_EPI_DEFAULT, [PLAN_EPI_BIAS] = CS_EPI_BIAS,
        [PLAN_EPI_GELU_AUX_BIAS] = CS_EPI_GELU_AUX_BIAS, [PLAN_EPI_DGELU_BGRAD] = CS_EPI_DGELU_BGRAD,
        [PLAN_EPI_BGRAD_A] = CS_EPI_BGRADB, [PLAN_EPI_BGRAD_B] = CS_EPI_BGRADA};
    g->epilogue = lt[c->epilogue];
    if (plan_epilogue_args(c->epilogue) >= 1) g->bias = cs_offset(p, p->ids[c->args + 3], rank);
    if (plan_epilogue_args(c->epilogue) >= 2) g->aux = cs_offset(p, p->ids[c->args + 4], rank);
    g->beta = c->beta == 1;
    if (g->beta) g->r = cs_offset(p, p->ids[c->args + c->n_args - 1], rank);
}

void cs_op_where(const Plan *p, int32_t op, char *buf, size_t n)
{
    if (op < 0 || op >= p->n_ops) {
        snprintf(buf, n, "op %d", op);
        return;
    }
    const PlanOp *o = &p->ops[op];
    int at = snprintf(buf, n, "op %d (%s)", op, plan_str(p, o->op));
    if (at < 0 || (size_t)at >= n || o->line <= 0) return;
    const char *src = plan_meta_str(p, "source", "");
    snprintf(buf + at, n - (size_t)at, " at %s%s%d:%d", src, *src ? ":" : "", o->line, o->col);
}

void cs_coll_describe(const Plan *p, const CsSchedule *s, int32_t ci, char *buf, size_t n)
{
    const CsColl *c = &s->colls[ci];
    cs_op_where(p, c->op, buf, n);
    size_t at = strlen(buf);
    int dp = s->world;
    if (c->kind == CS_SEND || c->kind == CS_RECV)
        snprintf(buf + at, n - at, ", %s rank %d (stage %d)", c->kind == CS_SEND ? "to" : "from", c->peer, c->peer / dp);
    else if (c->group == OP_GROUP_PIPE)
        snprintf(buf + at, n - at, ", over the %d stages at data-parallel index %d", s->stages, s->rank);
    else if (c->group == OP_GROUP_SHARD || c->group == OP_GROUP_REPLICA)
        snprintf(buf + at, n - at, ", over its %s group of stage %d", c->group == OP_GROUP_SHARD ? "shard" : "replica",
                 s->stage);
    else
        snprintf(buf + at, n - at, ", over the %d data-parallel ranks of stage %d", dp, s->stage);
}

static const PlanAttr *attr(const Plan *p, const PlanOp *o, const char *key)
{
    for (int32_t a = 0; a < o->n_attr; a++)
        if (!strcmp(plan_str(p, p->attrs[o->attr + a].key), key)) return &p->attrs[o->attr + a];
    return NULL;
}

static int64_t attr_int(const Plan *p, const PlanOp *o, const char *key, int64_t def)
{
    const PlanAttr *a = attr(p, o, key);
    if (!a || a->kind == PLAN_ATTR_INTS) return def;
    return a->kind == PLAN_ATTR_INT ? a->i : (int64_t)a->f;
}

/* Op k, a collective of `kind`, bound to this rank's bytes (views at vrank, its index in
 * its shard group), in the form NCCL runs it over its group: the stage's `world` ranks,
 * or with hybrid sharding the shard group (`shard` ranks, this one at vrank) or the
 * replica group (world / shard ranks, this one at rank / shard), or the pipeline's
 * stages at this data-parallel index (this one at s->stage). */
static int bind_coll(const Plan *p, int32_t k, CsCollKind kind, int vrank, int rank, const CsSchedule *s, CsColl *c,
                     char *err, size_t errlen)
{
    const PlanOp *o = &p->ops[k];
    const char *name = plan_str(p, o->op);
    int world = s->world, shard = s->shard;
    if (o->n_in != 1 || o->n_out != 1)
        return plan_fail(err, errlen, "op %d (%s): %d inputs and %d outputs; a collective has one of each", k, name, o->n_in,
                    o->n_out);
    int group = (int)attr_int(p, o, "group", OP_GROUP_DATA);
    if (group == OP_GROUP_SHARD) world = shard, rank = vrank;
    if (group == OP_GROUP_REPLICA) world = world / shard, rank = rank / shard;
    if (group == OP_GROUP_PIPE) world = s->stages, rank = s->stage;
    int64_t w = attr_int(p, o, "world", 1);
    if (w != world)
        return plan_fail(err, errlen, "op %d (%s) is for a world of %lld ranks, but this run has %d%s", k, name, (long long)w,
                    world, group == OP_GROUP_SHARD ? " in its shard group" : group == OP_GROUP_REPLICA ? " in its replica group"
                           : group == OP_GROUP_PIPE ? " in its pipeline" : "");
    int32_t x = p->ids[o->in], y = p->ids[o->out];
    const PlanTensor *tx = &p->tensors[x], *ty = &p->tensors[y];
    int64_t n_in = plan_tensor_numel(tx), n_out = plan_tensor_numel(ty), es = plan_dtype_size(tx->dtype);
    int sizes_ok = kind == CS_ALL_REDUCE ? n_in == n_out : kind == CS_REDUCE_SCATTER ? n_in == n_out * world
                                                                                      : n_out == n_in * world;
    if (tx->dtype != ty->dtype || !sizes_ok)
        return plan_fail(err, errlen, "op %d (%s) over %d ranks: %lld %s elements in, %lld %s out do not fit", k, name,
                    world, (long long)n_in, plan_dtype_name(tx->dtype), (long long)n_out, plan_dtype_name(ty->dtype));
    int avg = kind != CS_ALL_GATHER && attr_int(p, o, "avg", 0) != 0;
    if (avg && tx->dtype == PLAN_DT_I32)
        return plan_fail(err, errlen, "op %d (%s): an average of i32 elements", k, name);
    *c = (CsColl){.op = k, .kind = kind, .dtype = tx->dtype, .in = cs_offset(p, x, vrank), .out = cs_offset(p, y, vrank),
                  .count = kind == CS_ALL_GATHER ? n_in : n_out, .in_bytes = n_in * es, .out_bytes = n_out * es,
                  .avg = avg, .group = group, .avg_over = avg ? (int)attr_int(p, o, "avg_over", 0) : 0,
                  .async = world > 1, .link = -1};
    c->nccl_out = c->out;
    c->range[0] = (CsRange){c->in, c->in + c->in_bytes};
    c->range[1] = (CsRange){c->out, c->out + c->out_bytes};
    if (!overlap(c->range[0], c->range[1])) return 0;
    int64_t slice = (int64_t)rank * c->count * es;
    const char *why = NULL;
    switch (kind) {
    case CS_ALL_REDUCE:
        if (c->in != c->out) why = "its output overlaps its input without being it";
        break;
    case CS_REDUCE_SCATTER:
        if (c->out == c->in + slice || world == 1) break;
        if (c->range[1].lo < c->range[0].lo || c->range[1].hi > c->range[0].hi) {
            why = "its output overlaps its input without lying inside it";
            break;
        }
        c->nccl_out = c->in + slice, c->move = 1;
        if (overlap(c->range[1], (CsRange){c->nccl_out, c->nccl_out + c->out_bytes}))
            why = "its output overlaps this rank's slice of the input without being it";
        break;
    case CS_ALL_GATHER:
        if (c->in != c->out + slice && world > 1) why = "its input overlaps its output without being this rank's slice";
        break;
    default: break;
    }
    if (world == 1 && c->in != c->out && !why) why = "its output overlaps its input without being it";
    return why ? plan_fail(err, errlen, "op %d (%s) on rank %d: %s (NCCL cannot run that in place)", k, name, rank, why) : 0;
}

/* Op k, a send (its input to the peer) or a receive (into its output), bound to this
 * rank's bytes (views at vrank) and its peer's rank: stage `peer` at this data-parallel
 * index `rank`, as runtime/exec.c binds it on MPI. Its link is found once every op is
 * bound (links). */
static int bind_p2p(const Plan *p, int32_t k, CsCollKind kind, int vrank, int rank, const CsSchedule *s, CsColl *c,
                    char *err, size_t errlen)
{
    const PlanOp *o = &p->ops[k];
    const char *name = plan_str(p, o->op);
    int send = kind == CS_SEND;
    if (o->n_in != send || o->n_out != !send)
        return plan_fail(err, errlen, "op %d (%s): %d inputs and %d outputs; a %s has %s", k, name, o->n_in, o->n_out, name,
                         send ? "one input and no output" : "one output and no input");
    int64_t peer = attr_int(p, o, "peer", -1);
    if (peer < 0 || peer >= s->stages || peer == s->stage)
        return plan_fail(err, errlen, "op %d (%s): peer stage %lld, but this is stage %d of %d", k, name, (long long)peer,
                         s->stage, s->stages);
    int32_t x = p->ids[send ? o->in : o->out];
    const PlanTensor *t = &p->tensors[x];
    int64_t off = cs_offset(p, x, vrank), bytes = plan_tensor_nbytes(t);
    *c = (CsColl){.op = k, .kind = kind, .dtype = t->dtype, .in = off, .out = off, .nccl_out = off,
                  .count = plan_tensor_numel(t), .in_bytes = bytes, .out_bytes = bytes, .async = 1,
                  .peer = (int)peer * s->world + rank, .link = -1};
    c->range[0] = c->range[1] = (CsRange){off, off + bytes};
    return 0;
}

/* Link order: by peer stage, sends before receives, then by tag. */
static int link_cmp(const void *x, const void *y)
{
    const CsLink *a = x, *b = y;
    if (a->stage != b->stage) return a->stage < b->stage ? -1 : 1;
    if (a->send != b->send) return a->send > b->send ? -1 : 1;
    return (a->tag > b->tag) - (a->tag < b->tag);
}

static CsLink link_key(const Plan *p, const CsColl *c)
{
    const PlanOp *o = &p->ops[c->op];
    return (CsLink){.stage = (int)attr_int(p, o, "peer", -1), .send = c->kind == CS_SEND, .tag = attr_int(p, o, "tag", 0)};
}

/* The links the bound sends and receives use, each once, sorted (so the two ranks of a
 * link list it in the same order), and each op's. */
static void links(const Plan *p, CsSchedule *s)
{
    for (int32_t i = 0; i < s->n_colls; i++)
        if (s->colls[i].kind == CS_SEND || s->colls[i].kind == CS_RECV) s->links[s->n_links++] = link_key(p, &s->colls[i]);
    qsort(s->links, (size_t)s->n_links, sizeof *s->links, link_cmp);
    int32_t n = 0;
    for (int32_t i = 0; i < s->n_links; i++)
        if (!n || link_cmp(&s->links[n - 1], &s->links[i])) s->links[n++] = s->links[i];
    s->n_links = n;
    for (int32_t i = 0; i < s->n_colls; i++) {
        if (s->colls[i].kind != CS_SEND && s->colls[i].kind != CS_RECV) continue;
        CsLink key = link_key(p, &s->colls[i]);
        const CsLink *at = bsearch(&key, s->links, (size_t)s->n_links, sizeof *s->links, link_cmp);
        s->colls[i].link = (int32_t)(at - s->links);
    }
}

/* Op k's place in the host space, if it has one: a copy between the spaces, or an op
 * whose tensors lie there (plan_check: an op but a copy touches one space). */
static int bind_host(const Plan *p, int32_t k, int rank, CsSchedule *s, char *err, size_t errlen)
{
    const PlanOp *o = &p->ops[k];
    OpComm comm = op_comm_by_name(plan_str(p, o->op));
    if (comm == COMM_TO_HOST || comm == COMM_TO_DEVICE) {
        int32_t x = p->ids[o->in], y = p->ids[o->out];
        int up = comm == COMM_TO_DEVICE;
        s->copies[s->n_copies] = (CsCopy){.op = k, .to_device = up, .dev = cs_offset(p, up ? y : x, rank),
                                          .host = cs_offset(p, up ? x : y, rank),
                                          .bytes = plan_tensor_nbytes(&p->tensors[x])};
        s->ops[k].copy = s->n_copies++;
    } else if (plan_op_on_host(p, k)) {
        s->ops[k].host = 1;
        s->n_host++;
    }
    if ((s->ops[k].copy >= 0 || s->ops[k].host) && s->ops[k].n_instr)
        return plan_fail(err, errlen, "op %d (%s) runs on the host but has CUDA instructions (plan made by a different "
                         "fsc)", k, plan_str(p, o->op));
    return 0;
}

/* Instruction ranges, collectives, copies, host ops, LAUNCH args and GEMMs; every view
 * at vrank, the rank's index in its shard group (rank without hybrid sharding). */
static int bind(const Plan *p, int vrank, int rank, CsSchedule *s, char *err, size_t errlen)
{
    for (int32_t k = 0; k < p->n_ops; k++) s->ops[k].coll = s->ops[k].copy = -1;
    for (int32_t i = 0; i < p->n_cuda; i++) {
        CsOp *o = &s->ops[p->cuda[i].op];
        if (!o->n_instr) o->instr = i;
        o->n_instr++;
    }
    for (int32_t k = 0; k < p->n_ops; k++) {
        if (bind_host(p, k, vrank, s, err, errlen)) return -1;
        int kind = cs_coll_kind(plan_str(p, p->ops[k].op));
        if (kind < 0) continue;
        if (s->ops[k].n_instr)
            return plan_fail(err, errlen, "op %d (%s) has CUDA instructions; collectives run on NCCL by name (plan made by "
                        "a different fsc)", k, plan_str(p, p->ops[k].op));
        CsColl *c = &s->colls[s->n_colls];
        if (kind == CS_SEND || kind == CS_RECV ? bind_p2p(p, k, (CsCollKind)kind, vrank, rank, s, c, err, errlen)
                                               : bind_coll(p, k, (CsCollKind)kind, vrank, rank, s, c, err, errlen))
            return -1;
        s->n_pipe += c->group == OP_GROUP_PIPE && kind != CS_SEND && kind != CS_RECV;
        s->ops[k].coll = s->n_colls++;
    }
    links(p, s);
    int32_t at = 0;
    for (int32_t i = 0; i < p->n_cuda; i++) {
        const PlanCuda *c = &p->cuda[i];
        s->arg_at[i] = at;
        if (c->kind == PLAN_CU_GEMM) {
            cs_gemm(p, i, vrank, &s->gemms[i]);
            continue;
        }
        for (int32_t a = 0; a < c->n_args; a++) s->args[at++] = cs_offset(p, p->ids[c->args + a], vrank);
    }
    return 0;
}

/* The plan's schedule (passes/schedule.c), as the backend runs it: each op's waits on
 * ops of the other streams, as indices of events: a collective's (async: over more than
 * one rank; alone they are copies on the compute stream) is its index in colls, a copy's n_colls plus
 * its index in copies. */
static void stored_waits(const Plan *p, CsSchedule *s)
{
    int32_t at = 0;
    for (int32_t k = 0; k < s->n_ops; k++) {
        CsOp *o = &s->ops[k];
        o->wait = at;
        for (int32_t w = 0; w < p->ops[k].n_wait; w++) {
            const CsOp *q = &s->ops[p->waits[p->ops[k].wait + w]];
            if (q->coll >= 0 && s->colls[q->coll].async && k != s->colls[q->coll].op) s->waits[at++] = q->coll;
            if (q->copy >= 0) s->waits[at++] = s->n_colls + q->copy;
        }
        o->n_wait = at - o->wait;
    }
}

int cs_build(const Plan *p, int rank, int world, CsSchedule *s, char *err, size_t errlen)
{
    return cs_build_stage(p, rank, world, 0, 1, s, err, errlen);
}

int cs_build_stage(const Plan *p, int rank, int world, int stage, int stages, CsSchedule *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->n_ops = p->n_ops;
    s->world = world;
    s->stage = stage, s->stages = stages, s->rank = rank;
    s->shard = (int)plan_shard_group(p, world);
    int vrank = s->vrank = rank % s->shard;
    int64_t n_args = 0;
    for (int32_t i = 0; i < p->n_cuda; i++) n_args += p->cuda[i].n_args;
    size_t ops = sizeof *s->ops * (size_t)p->n_ops, instrs = (size_t)p->n_cuda + 1;
    s->ops = plan_alloc(ops);
    s->colls = plan_alloc(sizeof *s->colls * ((size_t)p->n_ops + 1));
    s->copies = plan_alloc(sizeof *s->copies * ((size_t)p->n_ops + 1));
    s->waits = plan_alloc(sizeof *s->waits * ((size_t)p->n_waits + 1));
    s->args = plan_alloc(sizeof *s->args * (size_t)(n_args + 1));
    s->arg_at = plan_alloc(sizeof *s->arg_at * instrs);
    s->gemms = plan_alloc(sizeof *s->gemms * instrs);
    s->links = plan_alloc(sizeof *s->links * ((size_t)p->n_ops + 1));
    if (!s->links || !s->ops || !s->colls || !s->copies || !s->waits || !s->args || !s->arg_at || !s->gemms) {
        cs_free(s);
        return plan_fail(err, errlen, "out of memory");
    }
    memset(s->ops, 0, ops);
    memset(s->gemms, 0, sizeof *s->gemms * instrs);
    int rc = plan_check_schedule(p, vrank, err, errlen) || bind(p, vrank, rank, s, err, errlen) ? -1 : 0;
    if (!rc) stored_waits(p, s);
    if (rc) cs_free(s);
    return rc;
}

void cs_free(CsSchedule *s)
{
    plan_dealloc(s->ops);
    plan_dealloc(s->colls);
    plan_dealloc(s->copies);
    plan_dealloc(s->waits);
    plan_dealloc(s->args);
    plan_dealloc(s->arg_at);
    plan_dealloc(s->gemms);
    plan_dealloc(s->links);
    memset(s, 0, sizeof *s);
}
