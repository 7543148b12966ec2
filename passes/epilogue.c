/* passes/epilogue.c: GEMM epilogues. A linear layer's bias add, its GELU, the GELU's
 * gradient and the bias gradient each cost a kernel and a round trip of the GEMM's output
 * through memory; cuBLASLt does them in the GEMM's epilogue instead. Here the graph says
 * so: the matmul and what follows it become one op, which the CPU backend runs as the
 * GEMM then one pass over its output, and CUDA as one cublasLtMatmul (codegen/cuda_gemm.c).
 *
 *   add(matmul(a, w), bias) ........................ matmul_bias(a, w, bias)          BIAS
 *   add(add(x, matmul(a, w)), bias) ................ add(x, matmul_bias(a, w, bias))  BIAS (x + (a w + bias),
 *                                                    torch's association of x + linear(a))
 *   gelu(add(matmul(a, w), bias)) .................. matmul_bias_gelu(a, w, bias)     GELU_AUX_BIAS: its second
 *                                                    output is the pre-activation, which gelu_bwd reads anyway
 *   gelu_bwd(pre, matmul(dy, w, tb)), sum_to(that) . matmul_dgelu_bgrad(dy, w, pre)    DGELU_BGRAD
 *   matmul(x, dy, ta) and sum_to(dy) (dy [..., N]) . matmul_bgrad(x, dy, side 1)       BGRADA (BGRADB for
 *                                                    matmul(dy, x, ta), side 0: a weight stored [N, C])
 * and with `fuse_residual` (on by default), a residual add in the op that makes one side:
 *   add(r, matmul_bias(a, w, bias)) ................ matmul_bias_add(a, w, bias, r)   BIAS, cuBLASLt's C = r
 *                                                    with beta 1 (D, the output, another buffer)
 *   add(r, matmul(a, w)) ........................... matmul_add(a, w, r)              beta 1 (also the sum of
 *                                                    two dX GEMMs: Llama's h read by wq, wk and wv)
 *   add(r, layernorm_bwd(x, w, dy)) ................ layernorm_bwd_add(x, w, dy, r)   its dx kernel adds r (the
 *                                                    residual stream's gradient; rmsnorm_bwd likewise)
 * r must be of the output's type, lie in a buffer other than the output's and be no
 * param's gradient (the shard pass may yet lay those in one flat buffer): no GEMM reads C
 * from the bytes it writes D to, no kernel reads r where it writes dx.
 *
 * A bias gradient is fused once: into its GELU's gradient where there is one, else into
 * the weight gradient's GEMM. A frozen bias has no sum_to and a frozen weight no weight
 * GEMM, so neither fuses; a GELU whose bias has no gradient keeps its gelu_bwd. The exact
 * (erf) GELU never fuses (cuBLASLt's epilogues are the tanh form): its bias add still does.
 *
 * Needs: the backward, recomputation and micro-batches in their final form (autodiff,
 *        recompute and pipeline ran: their copies fuse like the originals); the
 *        `fuse_gemm` setting (on by default), and `fuse_residual` for the residual adds.
 * Gives: each match above replaced by its op where the first of its nodes with every input
 *        in place stood; the replaced values' names, roles, views (a micro-batch's partial
 *        gradient sum) and readers carried by the new op's outputs (ir_value_take_over).
 *        The intermediate values it removes (the product, a sum before the bias, the
 *        gradient GELU's input) were read by the matched nodes alone. Every backend
 *        computes each fused op as the ops it replaced compute it (the CPU's bit for bit,
 *        but for the residual's association; r is added last, after the bias, as the add
 *        did), so the shard pass, fp16 loss scaling and the gradient accumulation see the
 *        values they saw. In 16 bits the fused ops round once where the ops rounded twice.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* ---- what may be removed ----------------------------------------------------------------- */

/* Whether value v is read by node `only` alone (once), is no output of the step, no
 * param's gradient, and neither lies in another buffer nor has one lying in it. */
static int private_to(const Graph *g, int v, int only)
{
    if (ir_view_parent(g, v) >= 0) return 0;
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == v) return 0;
    int reads = 0;
    for (int k = 0; k < g->n_nodes; k++)
        for (int i = 0; i < g->nodes[k].n_in; i++)
            if (ir_in(g, ir_node(g, k), i) == v && (k != only || reads++)) return 0;
    for (int w = 0; w < g->n_values; w++)
        if (ir_view_parent(g, w) == v || g->values[w].grad == v) return 0;
    return 1;
}

/* The node that makes v if it is an `op` node, else -1. */
static int made_by(const Graph *g, int v, OpKind op)
{
    int p = ir_value(g, v)->producer;
    return p >= 0 && g->nodes[p].op == op ? p : -1;
}

/* Whether matmul node m is one GEMM whose output rows are a's rows: b a matrix, a not
 * transposed (the forms the epilogues take a bias along N for). */
static int one_gemm(const Graph *g, int m)
{
    const Node *n = ir_node(g, m);
    return ir_value(g, ir_in(g, n, 1))->rank == 2 && ir_value(g, ir_in(g, n, 0))->rank >= 2 &&
           !ir_attr_int(g, n, "ta", 0);
}

/* Whether bias is a vector [N] of x's dtype, N x's last dim. */
static int bias_for(const Graph *g, int bias, int x)
{
    const Value *b = ir_value(g, bias), *v = ir_value(g, x);
    return b->rank == 1 && b->dtype == v->dtype && v->rank >= 1 && b->shape[0] == v->shape[v->rank - 1];
}

/* Whether sum_to node s sums x [..., N] (rank 2 or more) down to [N]. */
static int sums_rows(const Graph *g, int s, int x)
{
    const Node *n = ir_node(g, s);
    const Value *v = ir_value(g, x), *o = ir_value(g, ir_out(g, n, 0));
    return ir_in(g, n, 0) == x && v->rank >= 2 && o->rank == 1 && o->shape[0] == v->shape[v->rank - 1];
}

/* The sum_to node that sums x's rows, or -1. */
static int row_sum_of(const Graph *g, int x)
{
    for (int k = 0; k < g->n_nodes; k++)
        if (g->nodes[k].op == OP_sum_to && sums_rows(g, k, x)) return k;
    return -1;
}

/* Whether every reader of v comes after node `at`. */
static int read_after(const Graph *g, int v, int at)
{
    for (int k = 0; k <= at; k++)
        for (int i = 0; i < g->nodes[k].n_in; i++)
            if (ir_in(g, ir_node(g, k), i) == v) return 0;
    return 1;
}

/* ---- rewriting ------------------------------------------------------------------------- */

static Attr aint(const char *key, int64_t v) { return (Attr){.key = key, .kind = ATTR_INT, .i = v}; }

/* A node `op` like node `like` (block, phase, source, micro-batch, chunk), with matmul
 * node m's ta and tb (and side when >= 0). */
static int add_node(Graph *g, OpKind op, const int *in, int n_in, int like, int m, int side)
{
    const Node *l = ir_node(g, like), *mm = ir_node(g, m);
    Attr at[3] = {aint("ta", ir_attr_int(g, mm, "ta", 0)), aint("tb", ir_attr_int(g, mm, "tb", 0)), aint("side", side)};
    char err[256];
    int f = ir_node_add(g, op, in, n_in, at, side >= 0 ? 3 : 2, l->block, l->phase, l->loc, err, sizeof err);
    if (f < 0) fprintf(stderr, "epilogue: %s\n", err);
    FS_ASSERT(f >= 0);
    g->nodes[f].mb = g->nodes[like].mb, g->nodes[f].chunk = g->nodes[like].chunk;
    return f;
}

static int among(int x, const int *list, int n)
{
    for (int i = 0; i < n; i++)
        if (list[i] == x) return 1;
    return 0;
}

/* The nodes made since n_old (ids n_old.. in order) go where node `at` stood, after the
 * n_up nodes in up (moved there from later); the n_drop nodes in drop (read by nothing
 * now) go last and are removed. */
static void splice_up(Graph *g, int n_old, int at, const int *up, int n_up, const int *drop, int n_drop)
{
    int *order = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_nodes);
    int k = 0;
    for (int i = 0; i < n_old; i++) {
        if (i == at) {
            for (int u = 0; u < n_up; u++) order[k++] = up[u];
            for (int f = n_old; f < g->n_nodes; f++) order[k++] = f;
        }
        if (!among(i, drop, n_drop) && !among(i, up, n_up)) order[k++] = i;
    }
    for (int d = 0; d < n_drop; d++) order[k++] = drop[d];
    FS_ASSERT(k == g->n_nodes);
    ir_nodes_reorder(g, order);
    ir_graph_drop_last(g, n_drop);
}

static void splice(Graph *g, int n_old, int at, const int *drop, int n_drop)
{
    splice_up(g, n_old, at, NULL, 0, drop, n_drop);
}

static int out0(const Graph *g, int n) { return ir_out(g, ir_node(g, n), 0); }
static int in_(const Graph *g, int n, int i) { return ir_in(g, ir_node(g, n), i); }

/* add node k as the bias add of a matmul: *m the matmul, *bias its bias; 0 when it is not
 * one (the product read by the add alone). */
static int bias_add(const Graph *g, int k, int *m, int *bias)
{
    for (int side = 0; side < 2; side++) {
        int p = in_(g, k, side), b = in_(g, k, 1 - side), mm = made_by(g, p, OP_matmul);
        if (mm < 0 || !one_gemm(g, mm) || !bias_for(g, b, p) ||
            !ir_same_shape(ir_value(g, p), ir_value(g, out0(g, k))) || !private_to(g, p, k))
            continue;
        *m = mm, *bias = b;
        return 1;
    }
    return 0;
}

/* Whether node k is a GELU or GELU gradient of the tanh form: cuBLASLt's GELU epilogues
 * compute that one, so an exact (erf) GELU stays an op of its own. */
static int tanh_gelu(const Graph *g, int k) { return !ir_attr_int(g, ir_node(g, k), "exact", 0); }

/* The tanh gelu node that reads v (the only reader that is a gelu), or -1. */
static int gelu_of(const Graph *g, int v)
{
    int found = -1;
    for (int k = 0; k < g->n_nodes; k++)
        if (g->nodes[k].op == OP_gelu && in_(g, k, 0) == v) {
            if (found >= 0 || ir_attr_int(g, ir_node(g, k), "exact", 0)) return -1;
            found = k;
        }
    return found >= 0 && tanh_gelu(g, found) ? found : -1;
}

/* add(matmul, bias) [then gelu]: 1 when rewritten. */
static int fuse_bias(Graph *g, int k)
{
    int m, bias;
    if (!bias_add(g, k, &m, &bias)) return 0;
    int n_old = g->n_nodes, pre = out0(g, k), ge = gelu_of(g, pre);
    int in[3] = {in_(g, m, 0), in_(g, m, 1), bias};
    int f = add_node(g, ge >= 0 ? OP_matmul_bias_gelu : OP_matmul_bias, in, 3, k, m, -1);
    if (ge >= 0) {
        ir_value_take_over(g, out0(g, ge), out0(g, f));
        ir_value_take_over(g, pre, ir_out(g, ir_node(g, f), 1));
        splice(g, n_old, k, (int[]){m, k, ge}, 3);
    } else {
        ir_value_take_over(g, pre, out0(g, f));
        splice(g, n_old, k, (int[]){m, k}, 2);
    }
    return 1;
}

/* add(add(x, matmul), bias) as add(x, matmul_bias): 1 when rewritten. */
static int fuse_residual(Graph *g, int k)
{
    for (int side = 0; side < 2; side++) {
        int t = in_(g, k, side), bias = in_(g, k, 1 - side), inner = made_by(g, t, OP_add);
        if (inner < 0 || !private_to(g, t, k) || !bias_for(g, bias, t)) continue;
        for (int s = 0; s < 2; s++) {
            int p = in_(g, inner, s), x = in_(g, inner, 1 - s), m = made_by(g, p, OP_matmul);
            if (m < 0 || !one_gemm(g, m) || !private_to(g, p, inner) ||
                !ir_same_shape(ir_value(g, p), ir_value(g, x)) || !ir_same_shape(ir_value(g, p), ir_value(g, t)))
                continue;
            int n_old = g->n_nodes;
            int f = add_node(g, OP_matmul_bias, (int[]){in_(g, m, 0), in_(g, m, 1), bias}, 3, k, m, -1);
            char err[256];
            const Node *kn = ir_node(g, k);
            int r = ir_node_add(g, OP_add, (int[]){x, out0(g, f)}, 2, NULL, 0, kn->block, kn->phase, kn->loc, err,
                                sizeof err);
            FS_ASSERT(r >= 0);
            g->nodes[r].mb = g->nodes[k].mb, g->nodes[r].chunk = g->nodes[k].chunk;
            ir_value_take_over(g, out0(g, k), out0(g, r));
            splice(g, n_old, k, (int[]){m, inner, k}, 3);
            return 1;
        }
    }
    return 0;
}

/* gelu_bwd(pre, matmul(..)) and the sum_to of its rows: 1 when rewritten. */
static int fuse_dgelu(Graph *g, int k)
{
    int pre = in_(g, k, 0), d = in_(g, k, 1), m = made_by(g, d, OP_matmul), dp = out0(g, k);
    if (!tanh_gelu(g, k) || m < 0 || !one_gemm(g, m) || !private_to(g, d, k) ||
        ir_value(g, pre)->dtype != ir_value(g, d)->dtype)
        return 0;
    int s = row_sum_of(g, dp);
    if (s < 0 || !read_after(g, out0(g, s), k)) return 0;
    int n_old = g->n_nodes;
    int f = add_node(g, OP_matmul_dgelu_bgrad, (int[]){in_(g, m, 0), in_(g, m, 1), pre}, 3, k, m, -1);
    ir_value_take_over(g, dp, out0(g, f));
    ir_value_take_over(g, out0(g, s), ir_out(g, ir_node(g, f), 1));
    splice(g, n_old, k, (int[]){m, k, s}, 3);
    return 1;
}

/* v itself, or what v is a reshape of. */
static int unreshaped(const Graph *g, int v)
{
    int r = made_by(g, v, OP_reshape);
    return r >= 0 ? in_(g, r, 0) : v;
}

enum { MAX_UP = 8 };  // nodes a fused bias gradient may take up with it

/* Whether value v is made before node s, or by nodes between s and k that can move up
 * before s with it (each single-output, of no effect, its inputs likewise): those join
 * up (*n_up of them). GPT-2's weight GEMM reads a reshape of dy, and the reshape of a
 * merge_heads the backward redoes. */
static int ready_before(const Graph *g, int v, int s, int *up, int *n_up, int depth)
{
    int p = ir_value(g, v)->producer;
    if (p < s || among(p, up, *n_up)) return 1;
    const Node *n = ir_node(g, p);
    int fixed = op_info(n->op)->flags & (OPF_EFFECT | OPF_COLLECTIVE | OPF_P2P | OPF_COPY);
    if (depth > 2 || *n_up == MAX_UP || n->n_out != 1 || fixed) return 0;
    for (int i = 0; i < n->n_in; i++)
        if (!ready_before(g, ir_in(g, n, i), s, up, n_up, depth + 1)) return 0;
    up[(*n_up)++] = p;
    return 1;
}

static int by_id(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* Where the fused op of matmul k and sum_to s goes: at k when nothing reads the sum before
 * k; else at s, when s comes first and k's inputs are made before s or can move up with
 * it (into up, in their order, *n_up of them); -1 when neither. */
static int bgrad_at(const Graph *g, int k, int s, int *up, int *n_up)
{
    *n_up = 0;
    if (read_after(g, out0(g, s), k)) return k;
    if (s > k) return -1;
    for (int i = 0; i < 2; i++)
        if (!ready_before(g, in_(g, k, i), s, up, n_up, 0)) return -1;
    qsort(up, (size_t)*n_up, sizeof *up, by_id);
    return s;
}

/* A weight gradient's matmul k of two matrices and the sum_to of its dy's rows: 1 when
 * rewritten. dy is op(b) untransposed (side 1) or op(a) under ta (side 0): [rows, N]
 * either way, the reduced dim the contracted one. */
static int fuse_bgrad(Graph *g, int k)
{
    const Node *n = ir_node(g, k);
    int a = ir_in(g, n, 0), b = ir_in(g, n, 1);
    if (ir_value(g, a)->rank != 2 || ir_value(g, b)->rank != 2) return 0;
    int ta = (int)ir_attr_int(g, n, "ta", 0), tb = (int)ir_attr_int(g, n, "tb", 0);
    for (int side = 1; side >= 0; side--) {
        if (side ? tb : !ta) continue;
        int v = side ? b : a, dy = unreshaped(g, v), s = row_sum_of(g, dy), up[MAX_UP], n_up, at;
        if (s < 0 || ir_value(g, v)->shape[1] != ir_value(g, out0(g, s))->shape[0] ||
            (at = bgrad_at(g, k, s, up, &n_up)) < 0)
            continue;
        int n_old = g->n_nodes;
        int f = add_node(g, OP_matmul_bgrad, (int[]){a, b}, 2, k, k, side);
        ir_value_take_over(g, out0(g, k), out0(g, f));
        ir_value_take_over(g, out0(g, s), ir_out(g, ir_node(g, f), 1));
        splice_up(g, n_old, at, up, n_up, (int[]){k, s}, 2);
        return 1;
    }
    return 0;
}

/* ---- residual adds ----------------------------------------------------------------------- */

/* The buffer value v lies in: v, or the root of the views it is one of. */
static int root_of(const Graph *g, int v)
{
    for (int p; (p = ir_view_parent(g, v)) >= 0;) v = p;
    return v;
}

/* Whether r can be read beside add node k's output being written: the same type, in
 * another buffer (cuBLASLt's C and D, a kernel's r and dx), and no param's gradient (those
 * the shard pass may yet lay in one flat buffer). */
static int residual_for(const Graph *g, int r, int k)
{
    int out = out0(g, k);
    if (!ir_same_shape(ir_value(g, r), ir_value(g, out)) || ir_value(g, r)->dtype != ir_value(g, out)->dtype ||
        root_of(g, r) == root_of(g, out))
        return 0;
    for (int w = 0; w < g->n_values; w++)
        if (g->values[w].grad >= 0 && (root_of(g, g->values[w].grad) == root_of(g, r) ||
                                       root_of(g, g->values[w].grad) == root_of(g, out)))
            return 0;
    return 1;
}

/* add(r, matmul_bias(a, w, bias)) as matmul_bias_add(a, w, bias, r), add(r, matmul(a, w))
 * as matmul_add(a, w, r), where the add stood: 1 when rewritten. */
static int fuse_gemm_add(Graph *g, int k)
{
    for (int side = 0; side < 2; side++) {
        int p = in_(g, k, side), r = in_(g, k, 1 - side);
        int mb = made_by(g, p, OP_matmul_bias), mm = made_by(g, p, OP_matmul), m = mb >= 0 ? mb : mm;
        if (m < 0 || p == r || (mm >= 0 && !one_gemm(g, mm)) || !private_to(g, p, k) || !residual_for(g, r, k) ||
            !ir_same_shape(ir_value(g, p), ir_value(g, r)) || ir_value(g, p)->dtype != ir_value(g, r)->dtype)
            continue;
        int n_old = g->n_nodes;
        int in[4] = {in_(g, m, 0), in_(g, m, 1), mb >= 0 ? in_(g, m, 2) : r, r};
        int f = add_node(g, mb >= 0 ? OP_matmul_bias_add : OP_matmul_add, in, mb >= 0 ? 4 : 3, k, m, -1);
        ir_value_take_over(g, out0(g, k), out0(g, f));
        splice(g, n_old, k, (int[]){m, k}, 2);
        return 1;
    }
    return 0;
}

/* add(r, layernorm_bwd(x, w, dy)) as layernorm_bwd_add(x, w, dy, r) (rmsnorm_bwd likewise):
 * the residual stream's gradient summed in the norm's dx kernel. It goes where the norm's
 * backward stood when r is made before it, else where the add stood when nothing reads dw
 * or db before that; 1 when rewritten. */
static int fuse_norm_add(Graph *g, int k)
{
    for (int side = 0; side < 2; side++) {
        int d = in_(g, k, side), r = in_(g, k, 1 - side), e = made_by(g, d, OP_layernorm_bwd);
        if (e < 0) e = made_by(g, d, OP_rmsnorm_bwd);
        if (e < 0 || d == r || out0(g, e) != d || !private_to(g, d, k) || !residual_for(g, r, k) ||
            !ir_same_shape(ir_value(g, d), ir_value(g, r)) || ir_value(g, d)->dtype != ir_value(g, r)->dtype)
            continue;
        const Node *en = ir_node(g, e);
        int early = ir_value(g, r)->producer < e, at = early ? e : k;
        for (int o = 1; !early && o < en->n_out; o++)
            if (!read_after(g, ir_out(g, en, o), k)) at = -1;
        if (at < 0) continue;
        int n_old = g->n_nodes, rms = en->op == OP_rmsnorm_bwd;
        Attr eps = {.key = "eps", .kind = ATTR_FLOAT, .f = ir_attr_float(g, en, "eps", 1e-5)};
        const Node *l = ir_node(g, at);
        char err[256];
        int f = ir_node_add(g, rms ? OP_rmsnorm_bwd_add : OP_layernorm_bwd_add,
                            (int[]){in_(g, e, 0), in_(g, e, 1), in_(g, e, 2), r}, 4, &eps, 1, l->block, l->phase,
                            l->loc, err, sizeof err);
        if (f < 0) fprintf(stderr, "epilogue: %s\n", err);
        FS_ASSERT(f >= 0);
        g->nodes[f].mb = g->nodes[at].mb, g->nodes[f].chunk = g->nodes[at].chunk;
        ir_value_take_over(g, out0(g, k), out0(g, f));
        for (int o = 1; o < ir_node(g, e)->n_out; o++)
            ir_value_take_over(g, ir_out(g, ir_node(g, e), o), ir_out(g, ir_node(g, f), o));
        splice(g, n_old, at, (int[]){e, k}, 2);
        return 1;
    }
    return 0;
}

/* Applies rule to every node of kind op until none changes. */
static void each(Graph *g, OpKind op, int (*rule)(Graph *, int))
{
    /* A rewrite drops at most three nodes before k, and its op is no `op` node: nodes
     * before those are as they were, and no rewrite makes an earlier node match. */
    for (int k = 0; k < g->n_nodes; k++)
        if (g->nodes[k].op == op && rule(g, k)) k = k > 4 ? k - 4 : -1;
}

int pass_epilogue(Graph *g, const Options *o, Diag *d)
{
    (void)d;
    if (!o->train.fuse_gemm) return 0;
    each(g, OP_add, fuse_bias);
    each(g, OP_add, fuse_residual);
    each(g, OP_gelu_bwd, fuse_dgelu);  // before fuse_bgrad: a GELU's bias gradient goes into its gradient's GEMM
    each(g, OP_matmul, fuse_bgrad);
    if (!o->train.fuse_residual) return 0;
    each(g, OP_add, fuse_gemm_add);  // after fuse_bias and fuse_residual: x + (a w + b) is add(x, matmul_bias)
    each(g, OP_add, fuse_norm_add);
    return 0;
}
