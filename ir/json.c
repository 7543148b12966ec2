/* ir/json.c: the graph as JSON (`fsc --emit ir-json`), for tools and notebooks.
 *
 *   {"model": "tiny",
 *    "blocks": [{"name": "h.0", "layer": "Block", "index": 0}],
 *    "values": [{"id": 0, "name": "tokens", "dtype": "i32", "shape": [4, 64],
 *                "role": "input", "block": null, "placement": "device",
 *                "producer": null, "loc": {"line": 3, "col": 3},
 *                "init": {"kind": "normal", "std": 0.02}, "tied_to": 3, "logical_rows": 300}],
 *                (params only; logical_rows: a padded vocabulary's own rows)
 *    "nodes":  [{"id": 0, "op": "embedding", "inputs": [1, 0], "outputs": [5],
 *                "attrs": {"n": 3, "eps": 1e-05, "shape": [4, -1]},
 *                "block": null, "phase": "forward", "group": null,
 *                "loc": {"line": 12, "col": 7}}],   (group: first node of its fused group)
 *    "outputs": [40]}                                                     (loss first)
 *
 * Ids are array indices, as in the text form; `block` is an index into "blocks" or null.
 * One item per line: each block, value and node is built as a jansson object, dumped on
 * its own line and released, so memory stays small on large graphs and diffs stay
 * readable. A failed allocation or write anywhere makes the call return -1.
 */
#include <jansson.h>

#include "ir.h"

/* Adds `val` under `key`; records a failure (the value is released either way). */
static void put(json_t *obj, const char *key, json_t *val, int *bad)
{
    if (!val || json_object_set_new(obj, key, val)) *bad = 1;
}

static void push(json_t *arr, json_t *val, int *bad)
{
    if (!val || json_array_append_new(arr, val)) *bad = 1;
}

static json_t *index_or_null(int i) { return i >= 0 ? json_integer(i) : json_null(); }

static json_t *loc_json(Loc loc, int *bad)
{
    json_t *o = json_object();
    if (!o) {
        *bad = 1;
        return NULL;
    }
    put(o, "line", json_integer(loc.line), bad);
    put(o, "col", json_integer(loc.col), bad);
    return o;
}

static json_t *init_json(const Value *v, int *bad)
{
    json_t *o = json_object();
    if (!o) {
        *bad = 1;
        return NULL;
    }
    put(o, "kind", json_string(init_name(v->init)), bad);
    if (v->init == INIT_NORMAL) {
        put(o, "mean", json_real(v->init_b), bad);
        put(o, "std", json_real(v->init_a), bad);
    }
    if (v->init == INIT_UNIFORM) {
        put(o, "low", json_real(v->init_a), bad);
        put(o, "high", json_real(v->init_b), bad);
    }
    return o;
}

static json_t *value_json(const Graph *g, int id, int *bad)
{
    const Value *v = ir_value(g, id);
    json_t *o = json_object(), *shape = json_array();
    if (!o || !shape) {
        json_decref(o);
        json_decref(shape);
        *bad = 1;
        return NULL;
    }
    put(o, "id", json_integer(id), bad);
    put(o, "name", v->name ? json_string(v->name) : json_null(), bad);
    put(o, "dtype", json_string(dtype_name(v->dtype)), bad);
    for (int d = 0; d < v->rank; d++) push(shape, json_integer(v->shape[d]), bad);
    put(o, "shape", shape, bad);
    put(o, "role", json_string(role_name(v->role)), bad);
    put(o, "block", index_or_null(v->block), bad);
    put(o, "placement", json_string(placement_name(v->place)), bad);
    put(o, "producer", index_or_null(v->producer), bad);
    put(o, "loc", loc_json(v->loc, bad), bad);
    if (v->init != INIT_NONE) put(o, "init", init_json(v, bad), bad);
    if (v->tied_to >= 0) put(o, "tied_to", json_integer(v->tied_to), bad);
    if (v->logical_rows) put(o, "logical_rows", json_integer(v->logical_rows), bad);  // passes/pad_vocab.c
    return o;
}

static json_t *attr_json(const Graph *g, const Attr *a, int *bad)
{
    if (a->kind == ATTR_INT) return json_integer(a->i);
    if (a->kind == ATTR_FLOAT) return json_real(a->f);
    json_t *arr = json_array();
    if (!arr) return NULL;
    for (int i = 0; i < a->n_list; i++) push(arr, json_integer(g->ints[a->list + i]), bad);
    return arr;
}

static json_t *ids_json(const Graph *g, int start, int n, int *bad)
{
    json_t *arr = json_array();
    if (!arr) {
        *bad = 1;
        return NULL;
    }
    for (int i = 0; i < n; i++) push(arr, json_integer(g->ids[start + i]), bad);
    return arr;
}

static json_t *node_json(const Graph *g, int id, int *bad)
{
    const Node *n = ir_node(g, id);
    json_t *o = json_object(), *attrs = json_object();
    if (!o || !attrs) {
        json_decref(o);
        json_decref(attrs);
        *bad = 1;
        return NULL;
    }
    put(o, "id", json_integer(id), bad);
    put(o, "op", json_string(op_name(n->op)), bad);
    put(o, "inputs", ids_json(g, n->in, n->n_in, bad), bad);
    put(o, "outputs", ids_json(g, n->out, n->n_out, bad), bad);
    for (int i = 0; i < n->n_attr; i++) {
        const Attr *a = &g->attrs[n->attr + i];
        put(attrs, a->key, attr_json(g, a, bad), bad);
    }
    put(o, "attrs", attrs, bad);
    put(o, "block", index_or_null(n->block), bad);
    put(o, "phase", json_string(phase_name(n->phase)), bad);
    put(o, "group", index_or_null(n->group), bad);
    put(o, "loc", loc_json(n->loc, bad), bad);
    return o;
}

static json_t *block_json(const Graph *g, int id, int *bad)
{
    json_t *b = json_object();
    if (!b) {
        *bad = 1;
        return NULL;
    }
    put(b, "name", json_string(g->blocks[id].name), bad);
    put(b, "layer", g->blocks[id].layer ? json_string(g->blocks[id].layer) : json_null(), bad);
    put(b, "index", json_integer(g->blocks[id].index), bad);
    return b;
}

/* Dumps one item on one line and releases it. */
static void dump(json_t *item, FILE *out, int *bad)
{
    if (!item || json_dumpf(item, out, JSON_ENCODE_ANY) != 0) *bad = 1;
    json_decref(item);
}

/* ` "key": [` then one item per line, built, dumped and released one at a time. */
static void dump_list(const Graph *g, const char *key, int n, json_t *(*make)(const Graph *, int, int *), FILE *out,
                      int *bad)
{
    fprintf(out, ",\n \"%s\": [", key);
    for (int i = 0; i < n && !*bad; i++) {
        fputs(i ? ",\n  " : "\n  ", out);
        dump(make(g, i, bad), out, bad);
    }
    fputs(n ? "\n ]" : "]", out);
}

int ir_print_json(const Graph *g, FILE *out)
{
    if (g->n_stage_graphs) {  // a pipelined graph: {"stages": [one graph per stage]}
        fputs("{\"stages\": [\n", out);
        for (int s = 0; s < g->n_stage_graphs; s++) {
            if (s) fputs(",\n", out);
            if (ir_print_json(g->stage_graphs[s], out)) return -1;
        }
        fputs("]}\n", out);
        return ferror(out) ? -1 : 0;
    }
    int bad = 0;
    fputs("{\n \"model\": ", out);
    dump(json_string(g->model ? g->model : ""), out, &bad);
    dump_list(g, "blocks", g->n_blocks, block_json, out, &bad);
    dump_list(g, "values", g->n_values, value_json, out, &bad);
    dump_list(g, "nodes", g->n_nodes, node_json, out, &bad);
    fputs(",\n \"outputs\": ", out);
    json_t *outputs = json_array();
    if (!outputs) bad = 1;
    for (int i = 0; i < g->n_outputs && outputs; i++) push(outputs, json_integer(g->outputs[i]), &bad);
    dump(outputs, out, &bad);
    fputs("\n}\n", out);
    return bad || ferror(out) ? -1 : 0;
}
