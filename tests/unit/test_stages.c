/* tests/unit/test_stages.c: pipeline stages (passes/stages.c) and their schedules
 * (passes/pipeline.c), on the stage graphs and on the plan.
 *  - Every block sits on exactly one stage, in order; an explicit balance is obeyed.
 *  - Each stage runs the schedule's order of micro-batch parts: GPipe's all forwards then
 *    all backwards; 1F1B's min(P - s - 1, M) warm-up forwards, then one forward and one
 *    backward in turn, so stage s has at most min(P - s, M) micro-batches in flight;
 *    interleaved 1F1B's Megatron order over model chunks; ZB-H1's 1F1B order of forwards
 *    and input gradients with each weight gradient after its input gradient.
 *  - checkpoint: always recomputes every micro-batch's forward, except_last all but the
 *    last one's, never none.
 *  - The k-th send from stage a to b and the k-th receive on b from a move the same type.
 *  - GPT-2's tied embedding is a param of the first and last stage, counted in the
 *    gradient norm by the first only; the plan has one program per stage and passes the
 *    point-to-point check.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "sample.h"

static const Define GPT2[] = {{"L", 8}, {"C", 32}, {"NH", 2}, {"T", 16}, {"V", 256}, {"B", 16}};

static Plan *compile_chunks(int stages, int m, const char *schedule, const char *checkpoint, const char *balance,
                           int chunks, Graph **g)
{
    char st[16], mb[16], world[16], ch[16];
    snprintf(st, sizeof st, "%d", stages);
    snprintf(mb, sizeof mb, "%d", m);
    snprintf(world, sizeof world, "%d", stages);
    snprintf(ch, sizeof ch, "%d", chunks);
    Setting set[] = {{"stages", st}, {"microbatches", mb}, {"world", world}, {"schedule", schedule},
                     {"checkpoint", checkpoint}, {"balance", balance}, {"chunks", ch}};
    return sample_compile("gpt2.fsm", GPT2, 6, set, 7, g);
}

static Plan *compile(int stages, int m, const char *schedule, const char *checkpoint, const char *balance, Graph **g)
{
    return compile_chunks(stages, m, schedule, checkpoint, balance, 1, g);
}

/* The blocks whose params stage graph sg holds, as a bit set. */
static unsigned blocks_of(const Graph *sg)
{
    unsigned set = 0;
    for (int v = 0; v < sg->n_values; v++)
        if (sg->values[v].role == ROLE_PARAM && sg->values[v].block >= 0) set |= 1u << sg->values[v].block;
    return set;
}

Test(stages, every_block_on_one_stage_in_order)
{
    for (int p = 2; p <= 8; p *= 2) {
        Graph *g;
        plan_free(compile(p, 8, "1f1b", "except_last", "auto", &g));
        cr_assert_eq(g->n_stage_graphs, p);
        unsigned all = 0;
        for (int s = 0; s < p; s++) {
            unsigned b = blocks_of(g->stage_graphs[s]);
            cr_assert(b != 0, "P=%d: stage %d has no block", p, s);
            cr_assert_eq(all & b, 0, "P=%d: a block of stage %d is on an earlier stage too", p, s);
            cr_assert(all < (b & -b), "P=%d: stage %d's blocks come before an earlier stage's", p, s);
            all |= b;
        }
        cr_assert_eq(all, 0xffu, "P=%d: blocks %x placed", p, all);
        ir_graph_free(g);
    }
    Graph *g;
    plan_free(compile(2, 2, "gpipe", "never", "3,5", &g));
    cr_assert_eq(blocks_of(g->stage_graphs[0]), 0x07u);
    cr_assert_eq(blocks_of(g->stage_graphs[1]), 0xf8u);
    ir_graph_free(g);
}

/* Stage graph sg's parts in node order: (mb, forward?, chunk) of each run of nodes of
 * one micro-batch, class and model chunk, into mb[]/fwd[]/chunk[]; returns how many. */
static int parts(const Graph *sg, int *mb, int *fwd, int *chunk, int cap)
{
    int n = 0;
    for (int k = 0; k < sg->n_nodes; k++) {
        const Node *node = ir_node(sg, k);
        if (node->mb < 0 || node->phase == PHASE_OPTIMIZER || node->phase == PHASE_COMM) continue;
        int f = node->phase == PHASE_FORWARD;
        if (n && mb[n - 1] == node->mb && fwd[n - 1] == f && chunk[n - 1] == node->chunk) continue;
        cr_assert_lt(n, cap);
        mb[n] = node->mb, fwd[n] = f, chunk[n] = node->chunk, n++;
    }
    return n;
}

static void check_order(int p, int m, const char *schedule)
{
    Graph *g;
    plan_free(compile(p, m, schedule, "never", "auto", &g));
    for (int s = 0; s < p; s++) {
        int mb[64], fwd[64], chunk[64], want_mb[64], want_fwd[64], n = parts(g->stage_graphs[s], mb, fwd, chunk, 64), w = 0;
        int warm = !strcmp(schedule, "gpipe") ? m : (p - s - 1 < m ? p - s - 1 : m);
        for (int i = 0; i < warm; i++) want_mb[w] = i, want_fwd[w++] = 1;
        for (int i = 0; i < m - warm; i++) {
            want_mb[w] = warm + i, want_fwd[w++] = 1;
            want_mb[w] = i, want_fwd[w++] = 0;
        }
        for (int i = m - warm; i < m; i++) want_mb[w] = i, want_fwd[w++] = 0;
        cr_assert_eq(n, w, "%s P=%d M=%d stage %d: %d parts, want %d", schedule, p, m, s, n, w);
        int in_flight = 0, most = 0;
        for (int i = 0; i < n; i++) {
            cr_assert(mb[i] == want_mb[i] && fwd[i] == want_fwd[i], "%s P=%d M=%d stage %d: part %d is %c%d, want %c%d",
                      schedule, p, m, s, i, fwd[i] ? 'F' : 'B', mb[i], want_fwd[i] ? 'F' : 'B', want_mb[i]);
            in_flight += fwd[i] ? 1 : -1;
            most = in_flight > most ? in_flight : most;
        }
        int held = !strcmp(schedule, "gpipe") ? m : (p - s < m ? p - s : m);
        cr_assert_eq(most, held, "%s P=%d M=%d stage %d: %d micro-batches in flight", schedule, p, m, s, most);
    }
    ir_graph_free(g);
}

Test(stages, gpipe_order) { check_order(2, 4, "gpipe"), check_order(4, 8, "gpipe"), check_order(4, 1, "gpipe"); }

/* Megatron's interleaved 1F1B: the k-th part of stage s is micro-batch
 * k / (P V) x P + k % P in local chunk k % (P V) / P (reversed for backwards), model
 * chunk local x P + s; (P - s - 1) x 2 + (V - 1) x P parts warm up (all when M == P). */
static void check_interleaved(int p, int v, int m)
{
    Graph *g;
    plan_free(compile_chunks(p, m, "interleaved", "never", "auto", v, &g));
    for (int s = 0; s < p; s++) {
        int mb[256], fwd[256], chunk[256], n = parts(g->stage_graphs[s], mb, fwd, chunk, 256), total = m * v, w = 0;
        int warm = m == p ? total : (p - s - 1) * 2 + (v - 1) * p;
        warm = warm < total ? warm : total;
        int want[512][3];
        for (int i = 0; i < warm; i++) want[w][0] = i, want[w][1] = 1, w++;  // warm-up forwards
        for (int i = 0; i < total - warm; i++) {  // then one forward and one backward
            want[w][0] = warm + i, want[w][1] = 1, w++;
            want[w][0] = i, want[w][1] = 0, w++;
        }
        for (int i = total - warm; i < total; i++) want[w][0] = i, want[w][1] = 0, w++;  // then the backwards
        for (int i = 0; i < w; i++) {  // virtual part k -> micro-batch, model chunk
            int k = want[i][0], local = k % (p * v) / p;
            want[i][0] = k / (p * v) * p + k % p;
            want[i][2] = (want[i][1] ? local : v - 1 - local) * p + s;
        }
        cr_assert_eq(n, w, "interleaved P=%d V=%d M=%d stage %d: %d parts, want %d", p, v, m, s, n, w);
        int in_flight = 0, most = 0;
        for (int i = 0; i < n; i++) {
            cr_assert(mb[i] == want[i][0] && fwd[i] == want[i][1] && chunk[i] == want[i][2],
                      "interleaved P=%d V=%d M=%d stage %d: part %d is %c%d of chunk %d, want %c%d of chunk %d", p, v, m,
                      s, i, fwd[i] ? 'F' : 'B', mb[i], chunk[i], want[i][1] ? 'F' : 'B', want[i][0], want[i][2]);
            in_flight += fwd[i] ? 1 : -1;
            most = in_flight > most ? in_flight : most;
        }
        int held = warm + 1 < total ? warm + 1 : total;
        cr_assert_eq(most, held, "interleaved P=%d V=%d M=%d stage %d: %d parts in flight, want %d", p, v, m, s, most,
                     held);
    }
    ir_graph_free(g);
}

/* ZB-H1: every micro-batch's F, B and W once each, in that order; 1F1B's order of the
 * forwards and backwards; never more than P micro-batches whose W is not done. */
static void check_zb1(int p, int m)
{
    Graph *g;
    plan_free(compile(p, m, "zb1", "never", "auto", &g));
    for (int s = 0; s < p; s++) {
        const Graph *sg = g->stage_graphs[s];
        int seen[64][3] = {{0}}, step = 0, f = 0, w = 0, most = 0, fb[128], n_fb = 0, last = -1, last_part = -1;
        for (int k = 0; k < sg->n_nodes; k++) {
            const Node *node = ir_node(sg, k);
            if (node->mb < 0 || node->phase == PHASE_OPTIMIZER || node->phase == PHASE_COMM) continue;
            int part = node->phase == PHASE_FORWARD ? 0 : node->phase == PHASE_WGRAD ? 2 : 1;
            if (node->mb == last && part == last_part) continue;
            last = node->mb, last_part = part, step++;
            cr_assert_eq(seen[node->mb][part], 0, "zb1 P=%d M=%d stage %d: micro-batch %d's part %d twice", p, m, s,
                         node->mb, part);
            cr_assert(part == 0 || seen[node->mb][part - 1], "zb1 P=%d M=%d stage %d: micro-batch %d's part %d early",
                      p, m, s, node->mb, part);
            seen[node->mb][part] = step;
            f += part == 0, w += part == 2;
            most = f - w > most ? f - w : most;
            if (part < 2) fb[n_fb++] = part == 0 ? node->mb : -1 - node->mb;
        }
        cr_assert_eq(step, 3 * m, "zb1 P=%d M=%d stage %d: %d parts", p, m, s, step);
        cr_assert_leq(most, p, "zb1 P=%d M=%d stage %d: %d micro-batches without their W", p, m, s, most);
        int warm = p - s - 1 < m ? p - s - 1 : m, i = 0;  // 1F1B's forwards and backwards
        for (int x = 0; x < warm; x++) cr_assert_eq(fb[i++], x);
        for (int x = 0; x < m - warm; x++) {
            cr_assert_eq(fb[i++], warm + x);
            cr_assert_eq(fb[i++], -1 - x);
        }
        for (int x = m - warm; x < m; x++) cr_assert_eq(fb[i++], -1 - x);
    }
    ir_graph_free(g);
}

Test(stages, zero_bubble_order) { check_zb1(2, 4), check_zb1(4, 8), check_zb1(4, 4), check_zb1(3, 8); }

Test(stages, interleaved_order)
{
    check_interleaved(2, 2, 4), check_interleaved(2, 2, 8), check_interleaved(4, 2, 8), check_interleaved(2, 4, 4);
    check_interleaved(2, 2, 2);
}
Test(stages, one_f_one_b_order) { check_order(2, 4, "1f1b"), check_order(4, 8, "1f1b"), check_order(4, 4, "1f1b"); }

static void check_checkpoint(const char *mode, int m)
{
    Graph *g;
    plan_free(compile(2, m, m >= 2 ? "1f1b" : "gpipe", mode, "auto", &g));
    for (int s = 0; s < 2; s++) {
        const Graph *sg = g->stage_graphs[s];
        for (int i = 0; i < m; i++) {
            int n = 0;
            for (int k = 0; k < sg->n_nodes; k++) n += sg->nodes[k].mb == i && sg->nodes[k].phase == PHASE_RECOMPUTE;
            int want = !strcmp(mode, "always") || (!strcmp(mode, "except_last") && i < m - 1);
            cr_assert_eq(n > 0, want, "checkpoint %s M=%d stage %d micro-batch %d: %d recompute nodes", mode, m, s, i, n);
        }
    }
    ir_graph_free(g);
}

Test(stages, checkpoint_modes)
{
    check_checkpoint("always", 4), check_checkpoint("except_last", 4), check_checkpoint("never", 4);
    check_checkpoint("except_last", 1);
}

static int64_t attr_of(const Plan *p, const PlanOp *op, const char *key, int64_t def)
{
    for (int32_t i = 0; i < op->n_attr; i++)
        if (!strcmp(plan_str(p, p->attrs[op->attr + i].key), key)) return p->attrs[op->attr + i].i;
    return def;
}

/* The type of the k-th send from stage a to b with a tag, and of the k-th receive on b
 * from a with that tag. */
static void check_pairs(const Plan *p)
{
    for (int32_t a = 0; a < p->n_programs; a++)
        for (int32_t b = 0; b < p->n_programs; b++)
            for (int64_t tag = 0; tag < 64; tag++) {
            if (a == b) continue;
            int32_t sends[4096], recvs[4096], ns = 0, nr = 0;
            for (int side = 0; side < 2; side++) {
                const PlanProgram *prog = &p->programs[side ? b : a];
                for (int32_t k = prog->first_op; k < prog->first_op + prog->n_ops; k++) {
                    const PlanOp *op = &p->ops[k];
                    const char *name = plan_str(p, op->op);
                    int64_t peer = attr_of(p, op, "peer", -1);
                    if (attr_of(p, op, "tag", 0) != tag) continue;
                    if (!side && !strcmp(name, "send") && peer == b) sends[ns++] = p->ids[op->in];
                    if (side && !strcmp(name, "recv") && peer == a) recvs[nr++] = p->ids[op->out];
                    cr_assert(ns < 4096 && nr < 4096);
                }
            }
            cr_assert_eq(ns, nr, "stage %d sends %d to stage %d, which receives %d", a, ns, b, nr);
            for (int i = 0; i < ns; i++) {
                const PlanTensor *x = &p->tensors[sends[i]], *y = &p->tensors[recvs[i]];
                cr_assert(x->dtype == y->dtype && plan_tensor_numel(x) == plan_tensor_numel(y),
                          "send %d from stage %d to %d: %s of %lld elements, received as %s of %lld", i, a, b,
                          plan_dtype_name(x->dtype), (long long)plan_tensor_numel(x), plan_dtype_name(y->dtype),
                          (long long)plan_tensor_numel(y));
            }
        }
    char err[1024];
    cr_assert_eq(plan_check_p2p(p, err, sizeof err), 0, "%s", err);
}

Test(stages, sends_meet_receives)
{
    const char *scheds[] = {"gpipe", "1f1b", "interleaved"};
    for (int i = 0; i < 3; i++)
        for (int p = 2; p <= 4; p *= 2) {
            Plan *plan = compile_chunks(p, 8, scheds[i], "except_last", "auto", i == 2 ? 2 : 1, NULL);
            cr_assert_eq(plan->n_programs, p);
            check_pairs(plan);
            plan_free(plan);
        }
}

Test(stages, tied_embedding_on_first_and_last_stage)
{
    Graph *g;
    Plan *plan = compile(4, 4, "1f1b", "except_last", "auto", &g);
    int found = 0;
    for (int s = 0; s < 4; s++) {
        const Graph *sg = g->stage_graphs[s];
        for (int v = 0; v < sg->n_values; v++) {
            const Value *x = ir_value(sg, v);
            if (x->role != ROLE_PARAM || !x->name || strcmp(x->name, "wte")) continue;
            cr_assert(s == 0 || s == 3, "wte on stage %d", s);
            cr_assert_eq(x->pipe_copy, s == 3, "stage %d: wte counted in the norm %s", s, s ? "twice" : "nowhere");
            cr_assert_eq(sg->n_tied, 1);
            cr_assert_eq(sg->tied[0].value, v);
            cr_assert(sg->tied[0].n_stages == 2 && sg->tied[0].stages[0] == 0 && sg->tied[0].stages[1] == 3);
            found++;
        }
    }
    cr_assert_eq(found, 2);
    ir_graph_free(g);
    plan_free(plan);
}
