/* ir/verify.c: checks every structural invariant of a graph.
 *
 *  - counts within capacities; every id (value, node, block, ids/attrs/ints range) in range;
 *  - enums (dtype, role, placement, phase, init, op) valid; ranks in [0, IR_MAX_RANK],
 *    dims positive;
 *  - each value is produced by at most one node, and Value.producer says which;
 *  - node i only reads values that no node produces or that a node j < i produced;
 *  - inputs and outputs count as the op's signature says; attributes are keys of the
 *    signature, of the right kind, unique, flags 0 or 1, and the ones without a default
 *    are present;
 *  - re-running the op's shape rule gives the recorded output types (which also checks
 *    axes and other attribute ranges);
 *  - what an OPF_INPLACE node writes over (its first input) lies in its last output's
 *    bytes (a view at offset 0), and no later node reads it nor the step outputs it.
 * Problems are printed one per line (`ir_verify: node 12 (matmul): ...`); the first
 * MAX_REPORTS are shown, then a count.
 *
 * Where it sits: after lowering and after every pass, in debug builds and tests.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

enum { MAX_REPORTS = 50 };

typedef struct {
    const Graph *g;
    FILE *out;
    int n;  // problems found
} Verifier;

static void report(Verifier *vf, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report(Verifier *vf, const char *fmt, ...)
{
    if (vf->n++ >= MAX_REPORTS || !vf->out) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("ir_verify: ", vf->out);
    vfprintf(vf->out, fmt, ap);
    fputc('\n', vf->out);
    va_end(ap);
}

static int in_range(int start, int n, int limit) { return start >= 0 && n >= 0 && start <= limit && n <= limit - start; }

static int check_counts(Verifier *vf)
{
    const Graph *g = vf->g;
    struct { const char *what; const void *arr; int n, cap; } c[] = {
        {"values", g->values, g->n_values, g->cap_values}, {"nodes", g->nodes, g->n_nodes, g->cap_nodes},
        {"ids", g->ids, g->n_ids, g->cap_ids},             {"attrs", g->attrs, g->n_attrs, g->cap_attrs},
        {"ints", g->ints, g->n_ints, g->cap_ints},         {"blocks", g->blocks, g->n_blocks, g->cap_blocks},
        {"outputs", g->outputs, g->n_outputs, g->cap_outputs},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof c / sizeof *c; i++)
        if (c[i].n < 0 || c[i].n > c[i].cap || (c[i].n > 0 && !c[i].arr)) {
            report(vf, "graph: %d %s with capacity %d", c[i].n, c[i].what, c[i].cap);
            bad = 1;
        }
    return bad ? -1 : 0;
}

static void check_value(Verifier *vf, int id)
{
    const Graph *g = vf->g;
    const Value *v = ir_value(g, id);
    if ((unsigned)v->dtype >= DT_COUNT) report(vf, "value %d: bad dtype %d", id, (int)v->dtype);
    if ((unsigned)v->role >= ROLE_COUNT) report(vf, "value %d: bad role %d", id, (int)v->role);
    if ((unsigned)v->place >= PLACE_COUNT) report(vf, "value %d: bad placement %d", id, (int)v->place);
    if ((unsigned)v->init >= INIT_COUNT) report(vf, "value %d: bad init %d", id, (int)v->init);
    if (v->rank < 0 || v->rank > IR_MAX_RANK) {
        report(vf, "value %d: rank %d out of [0, %d]", id, v->rank, IR_MAX_RANK);
    } else {
        for (int d = 0; d < v->rank; d++)
            if (v->shape[d] <= 0) report(vf, "value %d: dim %d is %" PRId64, id, d, v->shape[d]);
    }
    if (v->block < -1 || v->block >= g->n_blocks) report(vf, "value %d: block %d out of range", id, v->block);
    if (v->producer < -1 || v->producer >= g->n_nodes) report(vf, "value %d: producer %d out of range", id, v->producer);
    if (v->tied_to < -1 || v->tied_to >= g->n_values || v->tied_to == id)
        report(vf, "value %d: tied_to %d out of range", id, v->tied_to);
}

/* Attributes: keys of the signature, right kind, once each; the required ones present.
 * Returns -1 when one could not be read safely (no key, a list out of range). */
static int check_attrs(Verifier *vf, int id, const OpInfo *info)
{
    const Graph *g = vf->g;
    const Node *n = ir_node(g, id);
    int seen[IR_MAX_PARAMS] = {0}, unsafe = 0;
    for (int i = 0; i < n->n_attr; i++) {
        const Attr *a = &g->attrs[n->attr + i];
        int p = 0;
        while (p < info->n_params && !(a->key && !strcmp(a->key, info->params[p].name))) p++;
        if (!a->key || p == info->n_params || info->params[p].kind <= ARG_TENSORS) {
            report(vf, "node %d (%s): unknown attribute '%s'", id, info->name, a->key ? a->key : "(null)");
            unsafe |= !a->key || (a->kind == ATTR_INTS && !in_range(a->list, a->n_list, g->n_ints));
            continue;
        }
        if (seen[p]++) report(vf, "node %d (%s): attribute '%s' given twice", id, info->name, a->key);
        ArgKind k = info->params[p].kind;
        AttrKind want = k == ARG_FLOAT ? ATTR_FLOAT : k == ARG_INTS ? ATTR_INTS : ATTR_INT;
        if (a->kind != want && !(want == ATTR_FLOAT && a->kind == ATTR_INT)) {
            report(vf, "node %d (%s): attribute '%s' has the wrong kind", id, info->name, a->key);
            continue;
        }
        if (k == ARG_FLAG && a->i != 0 && a->i != 1)
            report(vf, "node %d (%s): flag '%s' is %" PRId64 ", not 0 or 1", id, info->name, a->key, a->i);
        if (a->kind == ATTR_INTS && !in_range(a->list, a->n_list, g->n_ints)) {
            report(vf, "node %d (%s): attribute '%s' list [%d, +%d) out of range", id, info->name, a->key, a->list, a->n_list);
            unsafe = 1;
        }
    }
    for (int p = 0; p < info->n_params; p++)
        if (info->params[p].kind > ARG_TENSORS && !info->params[p].has_default && !seen[p])
            report(vf, "node %d (%s): attribute '%s' is missing", id, info->name, info->params[p].name);
    return unsafe ? -1 : 0;
}

/* Re-runs the shape rule and compares with the recorded outputs. */
static void check_types(Verifier *vf, int id, const OpInfo *info)
{
    const Graph *g = vf->g;
    const Node *n = ir_node(g, id);
    char err[256] = "", want[192], got[192];
    ShapeCtx c;
    if (ir_node_shape(g, n, &c, err, sizeof err) != 0) {
        report(vf, "node %d (%s): shape rule fails: %s", id, info->name, err);
        return;
    }
    if (c.n_out != n->n_out) {
        report(vf, "node %d (%s): %d outputs recorded, the shape rule makes %d", id, info->name, n->n_out, c.n_out);
        return;
    }
    for (int i = 0; i < n->n_out; i++) {
        const Value *v = ir_value(g, ir_out(g, n, i));
        int same = v->dtype == c.out[i].dtype && v->rank == c.out[i].rank;
        for (int d = 0; same && d < v->rank; d++) same = v->shape[d] == c.out[i].shape[d];
        if (!same)
            report(vf, "node %d (%s): output %d (%%%d) is %s, the shape rule says %s", id, info->name, i, ir_out(g, n, i),
                   ir_type_str(v, got, sizeof got), op_type_str(&c.out[i], want, sizeof want));
    }
}

/* Structure of node `id`: ranges, counts, and the producer links of its values.
 * `made_by[v]` is the node that lists v as an output (-1: none so far). Returns 0 when
 * the node is sound enough for its inputs and types to be checked. */
static int check_node(Verifier *vf, int id, int *made_by)
{
    const Graph *g = vf->g;
    const Node *n = ir_node(g, id);
    if ((unsigned)n->op >= OP_COUNT) {
        report(vf, "node %d: bad op %d", id, (int)n->op);
        return -1;
    }
    const OpInfo *info = op_info(n->op);
    int bad = 0;
    if (n->block < -1 || n->block >= g->n_blocks) report(vf, "node %d (%s): block %d out of range", id, info->name, n->block);
    if ((unsigned)n->phase >= PHASE_COUNT) report(vf, "node %d (%s): bad phase %d", id, info->name, (int)n->phase);
    if (!in_range(n->in, n->n_in, g->n_ids) || n->n_in > IR_MAX_IN || !in_range(n->out, n->n_out, g->n_ids) ||
        n->n_out > IR_MAX_OUT || !in_range(n->attr, n->n_attr, g->n_attrs)) {
        report(vf, "node %d (%s): input, output or attribute range out of bounds", id, info->name);
        return -1;
    }
    if (info->n_tensors >= 0 ? n->n_in != info->n_tensors : n->n_in < 1) {
        report(vf, "node %d (%s): %d inputs, the signature \"%s\" takes %s%d", id, info->name, n->n_in, info->sig,
               info->n_tensors < 0 ? "at least " : "", info->n_tensors < 0 ? 1 : info->n_tensors);
        bad = 1;
    }
    int min_out = (info->flags & OPF_EFFECT) ? 0 : 1;
    if (n->n_out < min_out || (info->n_out >= 0 && n->n_out != info->n_out)) {
        report(vf, "node %d (%s): %d outputs", id, info->name, n->n_out);
        bad = 1;
    }
    for (int i = 0; i < n->n_in; i++) {
        int v = ir_in(g, n, i);
        if (v < 0 || v >= g->n_values) {
            report(vf, "node %d (%s): input %d is value %d, out of range", id, info->name, i, v);
            bad = 1;
        } else if (g->values[v].producer >= id) {
            report(vf, "node %d (%s): input %d (%%%d) is produced by node %d, not before it", id, info->name, i, v,
                   g->values[v].producer);
            bad = 1;
        }
    }
    for (int i = 0; i < n->n_out; i++) {
        int v = ir_out(g, n, i);
        if (v < 0 || v >= g->n_values) {
            report(vf, "node %d (%s): output %d is value %d, out of range", id, info->name, i, v);
            bad = 1;
            continue;
        }
        if (made_by[v] >= 0) report(vf, "node %d (%s): output %%%d is also made by node %d", id, info->name, v, made_by[v]);
        else made_by[v] = id;
        if (g->values[v].producer != id)
            report(vf, "node %d (%s): output %%%d records producer %d", id, info->name, v, g->values[v].producer);
    }
    if (check_attrs(vf, id, info)) bad = 1;
    return bad ? -1 : 0;
}

/* The input an in-place node writes over is dead after it (ops.def: OPF_INPLACE). */
static void check_inplace(Verifier *vf, const int *sound)
{
    const Graph *g = vf->g;
    for (int i = 0; i < g->n_nodes; i++) {
        const Node *n = ir_node(g, i);
        if (!sound[i] || !(op_info(n->op)->flags & OPF_INPLACE)) continue;
        int x = ir_in(g, n, 0);
        for (int k = i + 1; k < g->n_nodes; k++)
            for (int j = 0; sound[k] && j < g->nodes[k].n_in; j++)
                if (ir_in(g, ir_node(g, k), j) == x)
                    report(vf, "node %d (%s) writes over %%%d, which node %d reads after it", i, op_name(n->op), x, k);
        for (int o = 0; o < g->n_outputs; o++)
            if (g->outputs[o] == x) report(vf, "node %d (%s) writes over %%%d, an output of the step", i, op_name(n->op), x);
        const Value *xv = ir_value(g, x);
        if (xv->view_of != ir_out(g, n, n->n_out - 1) || xv->view_offset || xv->view_rank_stride)
            report(vf, "node %d (%s) writes over %%%d, which is not a view of its last output", i, op_name(n->op), x);
    }
}

int ir_verify(const Graph *g, FILE *out)
{
    Verifier vf = {g, out, 0};
    if (check_counts(&vf)) return -1;
    int *made_by = malloc(sizeof(int) * (size_t)(g->n_values ? g->n_values : 1));
    if (!made_by) {
        report(&vf, "graph: out of memory");
        return -1;
    }
    for (int i = 0; i < g->n_values; i++) {
        made_by[i] = -1;
        check_value(&vf, i);
    }
    int values_sound = vf.n == 0;
    int *sound = calloc((size_t)(g->n_nodes ? g->n_nodes : 1), sizeof(int));
    if (!sound) {
        free(made_by);
        report(&vf, "graph: out of memory");
        return -1;
    }
    for (int i = 0; i < g->n_nodes; i++) sound[i] = check_node(&vf, i, made_by) == 0;
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i].producer >= 0 && g->values[i].producer < g->n_nodes && made_by[i] != g->values[i].producer)
            report(&vf, "value %d: producer %d does not list it as an output", i, g->values[i].producer);
    /* Shape rules read values through ids, so they only run on a graph whose values are
     * sound; otherwise a corrupt rank could send them past an array. */
    if (values_sound)
        for (int i = 0; i < g->n_nodes; i++)
            if (sound[i]) check_types(&vf, i, op_info(g->nodes[i].op));
    if (values_sound) check_inplace(&vf, sound);
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] < 0 || g->outputs[i] >= g->n_values) report(&vf, "output %d: value %d out of range", i, g->outputs[i]);
    free(made_by);
    free(sound);
    if (vf.n > MAX_REPORTS && out) fprintf(out, "ir_verify: ... and %d more problems\n", vf.n - MAX_REPORTS);
    return vf.n ? -1 : 0;
}
