/* ir/print.c: the stable text form of a graph (`fsc --emit ir`), read by people and
 * compared byte for byte by golden tests. Only ids, names and shapes appear (never
 * pointers or addresses), in array order, so the same graph always prints the same.
 *
 *   model tiny
 *
 *   block 0 h.0: Block 0
 *
 *   input %0 tokens: i32[4, 64]  @3:3
 *   param %2 h.0.attn.w: f32[128, 384] = normal(0.02)  [block h.0] @8:5
 *   param %2 wte: f32[320, 64] = normal(0.02) rows 300 its own   (a padded vocabulary)
 *
 *   %5: f32[4, 64, 128] = embedding(%1:wte, %0:tokens)  @12:7
 *   %7, %8, %9: f32[4, 64, 128] = split(%6, n=3, axis=-1)  [block h.0] @14:7
 *   %20:h.0.attn.w.grad: grad f32[128, 384] = matmul(%18, %11)  [block h.0, backward]
 *
 *   outputs: loss=%40
 *
 * Values no node produces are declared first (role, id, name, type, init); a node's
 * operands show the name of named values after a colon; an output line names its
 * outputs' role when it is not `act`, and `host` when placed there. Floats print in the
 * shortest form that reads back to the same double.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

/* Shortest %g that round-trips. */
static const char *num(double x, char *buf, size_t len)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    return buf;
}

static void print_ref(const Graph *g, int id, FILE *out)
{
    const Value *v = ir_value(g, id);
    fprintf(out, "%%%d", id);
    if (v->name) fprintf(out, ":%s", v->name);
}

/* "  [block h.0, backward, host, fused from %40] @12:5": only the parts that say
 * something (group: the first node of the node's fused group, -1 for none; it is named
 * by its first output). */
static void print_trailer(const Graph *g, int block, Phase phase, int host, int group, Loc loc, FILE *out)
{
    const char *parts[4];
    char blk[160], fused[48];
    int n = 0;
    if (block >= 0) {
        snprintf(blk, sizeof blk, "block %s", g->blocks[block].name);
        parts[n++] = blk;
    }
    if (phase != PHASE_FORWARD) parts[n++] = phase_name(phase);
    if (host) parts[n++] = "host";
    if (group >= 0) {
        snprintf(fused, sizeof fused, "fused from %%%d", ir_out(g, ir_node(g, group), 0));
        parts[n++] = fused;
    }
    if (n) {
        fputs("  [", out);
        for (int i = 0; i < n; i++) fprintf(out, "%s%s", i ? ", " : "", parts[i]);
        fputc(']', out);
    }
    if (loc.line > 0) fprintf(out, "%s@%d:%d", n ? " " : "  ", loc.line, loc.col);
    fputc('\n', out);
}

static void print_init(const Value *v, FILE *out)
{
    char a[32], b[32];
    switch (v->init) {
    case INIT_NONE: return;
    case INIT_NORMAL:
        if (v->init_b != 0) fprintf(out, " = normal(%s, %s)", num(v->init_b, b, sizeof b), num(v->init_a, a, sizeof a));
        else fprintf(out, " = normal(%s)", num(v->init_a, a, sizeof a));
        return;
    case INIT_UNIFORM: fprintf(out, " = uniform(%s, %s)", num(v->init_a, a, sizeof a), num(v->init_b, b, sizeof b)); return;
    case INIT_FULL: fprintf(out, " = full(%s)", num(v->init_a, a, sizeof a)); return;
    default: fprintf(out, " = %s", init_name(v->init)); return;
    }
}

/* A value no node produces: `param %3 h.0.attn.w: f32[768, 2304] = normal(0.02)`. */
static void print_decl(const Graph *g, int id, FILE *out)
{
    const Value *v = ir_value(g, id);
    char t[192];
    fprintf(out, "%s %%%d", role_name(v->role), id);
    if (v->name) fprintf(out, " %s", v->name);
    fprintf(out, ": %s", ir_type_str(v, t, sizeof t));
    print_init(v, out);
    if (v->tied_to >= 0) fprintf(out, " tied %%%d", v->tied_to);
    if (v->logical_rows) fprintf(out, " rows %" PRId64 " its own", v->logical_rows);  // passes/pad_vocab.c
    print_trailer(g, v->block, PHASE_FORWARD, v->place == PLACE_HOST, -1, v->loc, out);
}

static void print_attr(const Graph *g, const Attr *a, FILE *out)
{
    char buf[32];
    fprintf(out, "%s=", a->key);
    switch (a->kind) {
    case ATTR_INT: fprintf(out, "%" PRId64, a->i); break;
    case ATTR_FLOAT: fputs(num(a->f, buf, sizeof buf), out); break;
    case ATTR_INTS:
        fputc('[', out);
        for (int i = 0; i < a->n_list; i++) fprintf(out, "%s%" PRId64, i ? ", " : "", g->ints[a->list + i]);
        fputc(']', out);
        break;
    }
}

/* An output is plain when only its type needs saying. */
static int plain(const Value *v) { return !v->name && v->role == ROLE_ACT && v->place == PLACE_DEVICE; }

static void print_outputs(const Graph *g, const Node *n, FILE *out)
{
    char t[192], u[192];
    int compact = 1;
    const Value *v0 = ir_value(g, ir_out(g, n, 0));
    for (int i = 0; i < n->n_out; i++) {
        const Value *v = ir_value(g, ir_out(g, n, i));
        compact &= plain(v) && !strcmp(ir_type_str(v, t, sizeof t), ir_type_str(v0, u, sizeof u));
    }
    if (compact) {
        for (int i = 0; i < n->n_out; i++) fprintf(out, "%s%%%d", i ? ", " : "", ir_out(g, n, i));
        fprintf(out, ": %s", ir_type_str(v0, t, sizeof t));
        return;
    }
    for (int i = 0; i < n->n_out; i++) {
        const Value *v = ir_value(g, ir_out(g, n, i));
        if (i) fputs(", ", out);
        print_ref(g, ir_out(g, n, i), out);
        fputs(": ", out);
        if (v->role != ROLE_ACT) fprintf(out, "%s ", role_name(v->role));
        if (v->place == PLACE_HOST) fputs("host ", out);
        fputs(ir_type_str(v, t, sizeof t), out);
    }
}

static void print_node(const Graph *g, int id, FILE *out)
{
    const Node *n = ir_node(g, id);
    if (n->n_out) {
        print_outputs(g, n, out);
        fputs(" = ", out);
    }
    fprintf(out, "%s(", op_name(n->op));
    for (int i = 0; i < n->n_in; i++) {
        if (i) fputs(", ", out);
        print_ref(g, ir_in(g, n, i), out);
    }
    for (int i = 0; i < n->n_attr; i++) {
        if (i || n->n_in) fputs(", ", out);
        print_attr(g, &g->attrs[n->attr + i], out);
    }
    fputc(')', out);
    if (n->mb >= 0) fprintf(out, " mb%d", n->mb);
    print_trailer(g, n->block, n->phase, 0, n->group, n->loc, out);
}

void ir_print(const Graph *g, FILE *out)
{
    for (int s = 0; s < g->n_stage_graphs; s++) {  // a pipelined graph: its stages
        fprintf(out, "%s# stage %d of %d\n", s ? "\n" : "", s, g->n_stage_graphs);
        ir_print(g->stage_graphs[s], out);
    }
    if (g->n_stage_graphs) return;
    fprintf(out, "model %s\n", g->model ? g->model : "?");
    if (g->n_blocks) fputc('\n', out);
    for (int i = 0; i < g->n_blocks; i++)
        fprintf(out, "block %d %s: %s %d\n", i, g->blocks[i].name, g->blocks[i].layer ? g->blocks[i].layer : "?",
                g->blocks[i].index);

    int first = 1;
    for (int i = 0; i < g->n_values; i++) {
        if (g->values[i].producer >= 0) continue;
        if (first) fputc('\n', out), first = 0;
        print_decl(g, i, out);
    }
    if (g->n_nodes) fputc('\n', out);
    for (int i = 0; i < g->n_nodes; i++) print_node(g, i, out);

    if (g->n_outputs) {
        fputs("\noutputs:", out);
        for (int i = 0; i < g->n_outputs; i++) {
            int id = g->outputs[i];
            const char *name = i == 0 ? "loss" : g->values[id].name;
            fprintf(out, "%s", i ? ", " : " ");
            if (name) fprintf(out, "%s=", name);
            fprintf(out, "%%%d", id);
        }
        fputc('\n', out);
    }
}
