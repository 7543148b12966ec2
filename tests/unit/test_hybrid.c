/* tests/unit/test_hybrid.c: hybrid sharding (shard_group S of D data-parallel ranks),
 * checked from first principles.
 *  - Degenerate groups: S = D compiles to exactly the plan without a shard group (every
 *    op, attribute and tensor size alike), S = 1 to exactly ddp's plan (its all-reduces,
 *    never a plan without reductions).
 *  - Bytes: with Psi the fp32 bytes of a unit's params padded to a multiple of S, a
 *    rank's payload within its shard group is fsdp's gathers and the reduce-scatter
 *    (Psi each; blocks gather twice) plus the gradient norm's scalar, and across the
 *    groups the all-reduce of its shard, 2 Psi / S; the across-hosts ring sends
 *    2 M (D - S) / (S D) with M the sum of Psi.
 *  - The gradsum pass (passes/gradsum.c) rejects a plan with a reduction removed, a
 *    reduction doubled, or the average taken twice.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"
#include "sample.h"

static const Define GPT[] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 256}, {"B", 24}};

/* gpt2 (or the mlp) with shard and world, and a shard_group when group is not NULL. */
static Plan *compile(const char *file, const char *shard, int world, const char *group, Graph **g)
{
    char w[16];
    snprintf(w, sizeof w, "%d", world);
    Setting set[] = {{"shard", shard}, {"world", w}, {"shard_group", group}};
    int gpt = !strcmp(file, "gpt2.fsm");
    const Define mlp[] = {{"B", 24}};
    return sample_compile(file, gpt ? GPT : mlp, gpt ? 6 : 1, set, group ? 3 : 2, g);
}

static int is_collective(const Plan *p, const PlanOp *o)
{
    OpComm k = report_op_comm(p, o);
    return k == COMM_ALL_REDUCE || k == COMM_REDUCE_SCATTER || k == COMM_ALL_GATHER;
}

/* Op a of plan p and op b of q alike: name, attributes, and the bytes of every tensor. */
static void same_op(const Plan *p, int32_t a, const Plan *q, int32_t b, const char *what)
{
    const PlanOp *x = &p->ops[a], *y = &q->ops[b];
    cr_assert_str_eq(plan_str(p, x->op), plan_str(q, y->op), "%s: op %d", what, a);
    cr_assert_eq(x->n_attr, y->n_attr, "%s: op %d (%s) attributes", what, a, plan_str(p, x->op));
    for (int32_t i = 0; i < x->n_attr; i++) {
        const PlanAttr *u = &p->attrs[x->attr + i], *v = &q->attrs[y->attr + i];
        cr_assert_str_eq(plan_str(p, u->key), plan_str(q, v->key), "%s: op %d", what, a);
        cr_assert(u->kind == v->kind && u->i == v->i && u->f == v->f, "%s: op %d (%s) attribute %s", what, a,
                  plan_str(p, x->op), plan_str(p, u->key));
    }
    cr_assert(x->n_in == y->n_in && x->n_out == y->n_out, "%s: op %d", what, a);
    for (int32_t i = 0; i < x->n_in + x->n_out; i++)
        cr_assert_eq(plan_tensor_nbytes(&p->tensors[p->ids[x->in + i]]), plan_tensor_nbytes(&q->tensors[q->ids[y->in + i]]),
                     "%s: op %d (%s) tensor %d", what, a, plan_str(p, x->op), i);
}

static void same_plan(const Plan *p, const Plan *q, const char *what)
{
    cr_assert_eq(p->n_ops, q->n_ops, "%s: %d ops, %d", what, p->n_ops, q->n_ops);
    for (int32_t k = 0; k < p->n_ops; k++) same_op(p, k, q, k, what);
    cr_assert_eq(plan_space_bytes(p, PLAN_PLACE_DEVICE), plan_space_bytes(q, PLAN_PLACE_DEVICE), "%s: arena", what);
    CommTotals a = comm_totals(p), b = comm_totals(q);
    cr_assert(a.collectives == b.collectives && a.bytes == b.bytes && a.ring_bytes == b.ring_bytes, "%s: comm", what);
    cr_assert(a.within_bytes == 0 && a.across_bytes == 0, "%s: no hybrid groups", what);
}

Test(hybrid, group_of_all_ranks_is_the_plan_without_groups)
{
    static const char *const shards[] = {"zero1", "zero2", "fsdp"};
    for (int k = 0; k < 3; k++) {
        Plan *plain = compile("gpt2.fsm", shards[k], 4, NULL, NULL), *all = compile("gpt2.fsm", shards[k], 4, "4", NULL);
        same_plan(all, plain, shards[k]);
        plan_free(plain), plan_free(all);
    }
}

Test(hybrid, group_of_one_is_ddp)
{
    static const char *const shards[] = {"zero1", "zero2", "fsdp"};
    Plan *ddp = compile("gpt2.fsm", "ddp", 4, NULL, NULL);
    int reductions = 0;
    for (int32_t k = 0; k < ddp->n_ops; k++) reductions += report_op_comm(ddp, &ddp->ops[k]) == COMM_ALL_REDUCE;
    cr_assert_gt(reductions, 3, "ddp all-reduces its units' gradients");
    for (int k = 0; k < 3; k++) {
        Plan *one = compile("gpt2.fsm", shards[k], 4, "1", NULL);
        int32_t b = 0;
        for (int32_t a = 0; a < one->n_ops; a++) {  // the same collectives, in the same order
            if (!is_collective(one, &one->ops[a])) continue;
            while (b < ddp->n_ops && !is_collective(ddp, &ddp->ops[b])) b++;
            cr_assert_lt(b, ddp->n_ops, "%s shard_group 1: more collectives than ddp", shards[k]);
            same_op(one, a, ddp, b++, shards[k]);
        }
        while (b < ddp->n_ops && !is_collective(ddp, &ddp->ops[b])) b++;
        cr_assert_eq(b, ddp->n_ops, "%s shard_group 1: fewer collectives than ddp", shards[k]);
        same_plan(one, ddp, shards[k]);  // and so the whole plan: it is ddp
        plan_free(one);
    }
    plan_free(ddp);
}

/* Psi of each unit: 4 bytes a param element, padded to a multiple of S; blocks first,
 * then the params outside them (at n_blocks). The model's params are the views in their
 * unit's flat buffer (none flattens as ddp at world 1); the buffer is not counted again. */
static void unit_psi(const Plan *none, int64_t S, int64_t *psi)
{
    for (int32_t u = 0; u <= none->n_blocks; u++) psi[u] = 0;
    for (int32_t i = 0; i < none->n_tensors; i++) {
        const PlanTensor *t = &none->tensors[i];
        if (t->role == PLAN_ROLE_PARAM && t->tied_to == PLAN_NONE && t->alias != PLAN_NONE)
            psi[t->block >= 0 ? t->block : none->n_blocks] += plan_tensor_numel(t);
    }
    for (int32_t u = 0; u <= none->n_blocks; u++) psi[u] = 4 * ((psi[u] + S - 1) / S * S);
}

Test(hybrid, bytes_within_and_across_groups)
{
    static const char *const shards[] = {"zero2", "fsdp"};
    Plan *none = compile("gpt2.fsm", "none", 1, NULL, NULL);
    int64_t psi[64];
    for (int S = 2; S <= 4; S += 2) {
        int D = 8;
        unit_psi(none, S, psi);
        for (int k = 0; k < 2; k++) {
            char group[8];
            snprintf(group, sizeof group, "%d", S);
            Plan *p = compile("gpt2.fsm", shards[k], D, group, NULL);
            CommTotals c = comm_totals(p);
            double within = 8, across = 0, M = 0;  // within: the gradient norm's f32 sum (2 x 4 bytes)
            for (int32_t u = 0; u <= none->n_blocks; u++) {
                int gathers = k == 1 && u < none->n_blocks ? 2 : 1;  // fsdp regathers a block for its backward
                within += (double)(gathers + 1) * (double)psi[u];
                across += 2.0 * (double)psi[u] / S;
                M += (double)psi[u];
            }
            cr_expect_float_eq(c.within_bytes, within, 1e-9, "%s S=%d: within %g, formula %g", shards[k], S, c.within_bytes,
                               within);
            cr_expect_float_eq(c.across_bytes, across, 1e-9, "%s S=%d: across %g, formula %g", shards[k], S, c.across_bytes,
                               across);
            cr_expect_float_eq(c.across_grad_bytes, M, 1e-9, "%s S=%d: M", shards[k], S);
            double hosts = 2 * M * (D - S) / ((double)S * D);
            cr_expect_float_eq(c.across_ring_bytes, hosts, 1e-6, "%s S=%d: across hosts %g, 2M(W-S)/(SW) %g", shards[k],
                               S, c.across_ring_bytes, hosts);
            cr_expect_float_eq(c.bytes, within + across + 8, 1e-9, "%s S=%d: the loss's sum is over all ranks", shards[k],
                               S);
            plan_free(p);
        }
    }
    plan_free(none);
}

/* The first node of g with op and group attribute group, or -1. */
static int find_node(const Graph *g, OpKind op, int64_t group)
{
    for (int n = 0; n < g->n_nodes; n++)
        if (g->nodes[n].op == op && ir_attr_int(g, &g->nodes[n], "group", OP_GROUP_DATA) == group) return n;
    return -1;
}

/* pass_gradsum on g over D ranks: its message, or "" when it passes. */
static const char *gradsum(Graph *g, int D)
{
    static char buf[4096];
    memset(buf, 0, sizeof buf);
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    Diag d;
    diag_init(&d, "m.fsm", NULL, 0, f);
    Options o = {0};
    o.train.world = D;
    int rc = pass_gradsum(g, &o, &d);
    fclose(f);
    cr_assert_eq(rc != 0, d.n_errors > 0, "gradsum: rc %d with %d errors", rc, d.n_errors);
    return rc ? buf : "";
}

/* A second reduction like node n, of its input: the gradient summed again. */
static void double_reduction(Graph *g, int n)
{
    Attr attrs[8];
    int n_attr = ir_node_attrs(g, &g->nodes[n], attrs);
    int in = ir_in(g, &g->nodes[n], 0);
    char err[256];
    cr_assert_geq(ir_node_add(g, g->nodes[n].op, &in, 1, attrs, n_attr, -1, PHASE_COMM, (Loc){0}, err, sizeof err), 0,
                  "%s", err);
}

Test(hybrid, gradsum_rejects_missing_doubled_and_twice_averaged_sums)
{
    Graph *g;
    plan_free(compile("mlp.fsm", "fsdp", 4, "2", &g));
    cr_assert_str_eq(gradsum(g, 4), "", "the compiled plan passes");
    cr_assert(strstr(gradsum(g, 8), "summed over 4 of the 8 data-parallel ranks"), "%s", gradsum(g, 8));
    int across = find_node(g, OP_all_reduce, OP_GROUP_REPLICA), within = find_node(g, OP_reduce_scatter, OP_GROUP_SHARD);
    cr_assert(across >= 0 && within >= 0);
    g->nodes[across].op = OP_copy;  // the replicas' all-reduce removed
    cr_assert(strstr(gradsum(g, 4), "summed over 2 of the 4 data-parallel ranks (reduce_scatter over the shard group of 2)"),
              "%s", gradsum(g, 4));
    g->nodes[across].op = OP_all_reduce;
    cr_assert_str_eq(gradsum(g, 4), "");
    double_reduction(g, within);  // the shard group's sum twice
    cr_assert(strstr(gradsum(g, 4), "summed over its shard group twice"), "%s", gradsum(g, 4));
    ir_graph_free(g);

    plan_free(compile("mlp.fsm", "ddp", 4, NULL, &g));
    cr_assert_str_eq(gradsum(g, 4), "");
    int ar = -1;
    for (int n = 0; n < g->n_nodes && ar < 0; n++)  // a gradient's all-reduce, not the loss's
        if (g->nodes[n].op == OP_all_reduce && ir_value(g, ir_in(g, &g->nodes[n], 0))->role == ROLE_GRAD) ar = n;
    cr_assert_geq(ar, 0);
    double_reduction(g, ar);
    cr_assert(strstr(gradsum(g, 4), "summed over its data-parallel group twice"), "%s", gradsum(g, 4));
    ir_graph_free(g);

    plan_free(compile("mlp.fsm", "zero2", 4, "2", &g));
    within = find_node(g, OP_reduce_scatter, OP_GROUP_SHARD);
    cr_assert_geq(within, 0);
    for (int i = 0; i < g->nodes[within].n_attr; i++)  // the shard group's sum averaged too: by 2, then by 4
        if (!strcmp(g->attrs[g->nodes[within].attr + i].key, "avg")) g->attrs[g->nodes[within].attr + i].i = 1;
    cr_assert(strstr(gradsum(g, 4), "is averaged 2 times"), "%s", gradsum(g, 4));
    ir_graph_free(g);
}
