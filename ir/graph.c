/* ir/graph.c: building and reading a Graph. All arrays grow inside the graph's arena.
 * ir_node_add is the one way nodes are made: it runs the op's shape rule, so every node
 * in a graph has typed, shaped outputs, and a failed rule leaves the graph untouched. */
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>

#include "ir.h"

#define GROW(g, arr, n, cap, need) ((g)->arr = arena_grow((g)->arena, (g)->arr, &(g)->cap, (need), sizeof *(g)->arr))

Graph *ir_graph_new(const char *model)
{
    Arena *a = arena_new();
    Graph *g = arena_alloc(a, sizeof *g);
    g->arena = a;
    g->model = arena_strdup(a, model ? model : "model");
    g->loss_scale = g->scale_good = -1;
    return g;
}

void ir_graph_free(Graph *g)
{
    if (!g) return;
    for (int s = 0; s < g->n_stage_graphs; s++) ir_graph_free(g->stage_graphs[s]);
    arena_free(g->arena);
}

int ir_value_add(Graph *g, const Value *v)
{
    GROW(g, values, n_values, cap_values, g->n_values + 1);
    Value *nv = &g->values[g->n_values];
    *nv = *v;
    if (v->name) nv->name = arena_strdup(g->arena, v->name);
    /* What passes compute starts unset, whatever the caller's copy held. */
    nv->grad = nv->alias = nv->view_of = nv->unit = nv->recompute_of = nv->work = -1;
    nv->pipe_copy = 0;
    nv->offset = nv->rank_stride = nv->view_offset = nv->view_rank_stride = nv->flat_offset = 0;
    nv->live_start = nv->live_end = nv->sharded = 0;
    nv->step_role = SR_NONE;  // a copy of another value does not take its role
    return g->n_values++;
}

int ir_block_add(Graph *g, const char *name, const char *layer, int index)
{
    GROW(g, blocks, n_blocks, cap_blocks, g->n_blocks + 1);
    g->blocks[g->n_blocks] = (Block){arena_strdup(g->arena, name), arena_strdup(g->arena, layer), index};
    return g->n_blocks++;
}

void ir_output_add(Graph *g, int value)
{
    FS_ASSERT(value >= 0 && value < g->n_values);
    GROW(g, outputs, n_outputs, cap_outputs, g->n_outputs + 1);
    g->outputs[g->n_outputs++] = value;
}

/* Appends the attributes; an ATTR_INTS list moves from the caller's Attr.ints into
 * g->ints, and Attr.list becomes its offset there. */
static int add_attrs(Graph *g, const Attr *attrs, int n)
{
    int start = g->n_attrs;
    GROW(g, attrs, n_attrs, cap_attrs, g->n_attrs + n);
    for (int i = 0; i < n; i++) {
        Attr a = attrs[i];
        a.key = arena_strdup(g->arena, a.key);
        if (a.kind == ATTR_INTS) {
            GROW(g, ints, n_ints, cap_ints, g->n_ints + a.n_list);
            if (a.n_list) memcpy(&g->ints[g->n_ints], a.ints, sizeof(int64_t) * (size_t)a.n_list);
            a.list = g->n_ints;
            a.ints = NULL;
            g->n_ints += a.n_list;
        }
        g->attrs[g->n_attrs++] = a;
    }
    return start;
}

int ir_node_add(Graph *g, OpKind op, const int *in, int n_in, const Attr *attrs, int n_attr,
                int block, Phase phase, Loc loc, char *err, size_t errlen)
{
    const OpInfo *info = op_info(op);
    FS_ASSERT(n_in >= 0 && n_in <= IR_MAX_IN);
    FS_ASSERT(info->n_tensors < 0 || info->n_tensors == n_in);
    /* Remember the sizes so a failed shape rule can roll everything back. */
    int n_attrs0 = g->n_attrs, n_ints0 = g->n_ints, n_ids0 = g->n_ids;

    GROW(g, nodes, n_nodes, cap_nodes, g->n_nodes + 1);
    Node *n = &g->nodes[g->n_nodes];
    *n = (Node){.op = op, .block = block, .phase = phase, .loc = loc, .group = -1, .mb = -1};
    n->attr = add_attrs(g, attrs, n_attr);
    n->n_attr = n_attr;
    GROW(g, ids, n_ids, cap_ids, g->n_ids + n_in);
    n->in = g->n_ids;
    n->n_in = n_in;
    for (int i = 0; i < n_in; i++) {
        FS_ASSERT(in[i] >= 0 && in[i] < g->n_values);
        g->ids[g->n_ids++] = in[i];
    }

    ShapeCtx c;
    if (ir_node_shape(g, n, &c, err, errlen) != 0) {
        g->n_attrs = n_attrs0, g->n_ints = n_ints0, g->n_ids = n_ids0;
        return -1;
    }
    FS_ASSERT(c.n_out >= ((info->flags & OPF_EFFECT) ? 0 : 1) && c.n_out <= IR_MAX_OUT);

    int id = g->n_nodes++;
    GROW(g, ids, n_ids, cap_ids, g->n_ids + c.n_out);
    n = &g->nodes[id];
    n->out = g->n_ids;
    n->n_out = c.n_out;
    for (int i = 0; i < c.n_out; i++) {
        Value v = {.dtype = c.out[i].dtype, .rank = c.out[i].rank};
        memcpy(v.shape, c.out[i].shape, sizeof v.shape);
        v.role = ROLE_ACT;
        v.block = block;
        v.place = PLACE_DEVICE;
        v.name = NULL;
        v.loc = loc;
        v.producer = id;
        v.init = INIT_NONE;
        v.tied_to = -1;
        g->ids[g->n_ids++] = ir_value_add(g, &v);
    }
    return id;
}

static const Attr *find_attr(const Graph *g, const Node *n, const char *key)
{
    for (int i = 0; i < n->n_attr; i++)
        if (!strcmp(g->attrs[n->attr + i].key, key)) return &g->attrs[n->attr + i];
    return NULL;
}

int ir_node_attrs(const Graph *g, const Node *n, Attr *out)
{
    FS_ASSERT(n->n_attr <= IR_MAX_PARAMS);
    for (int i = 0; i < n->n_attr; i++) {
        out[i] = g->attrs[n->attr + i];
        if (out[i].kind == ATTR_INTS) out[i].ints = &g->ints[out[i].list];
    }
    return n->n_attr;
}

int64_t ir_attr_int(const Graph *g, const Node *n, const char *key, int64_t def)
{
    const Attr *a = find_attr(g, n, key);
    return a && a->kind == ATTR_INT ? a->i : a && a->kind == ATTR_FLOAT ? (int64_t)a->f : def;
}

double ir_attr_float(const Graph *g, const Node *n, const char *key, double def)
{
    const Attr *a = find_attr(g, n, key);
    return a && a->kind == ATTR_FLOAT ? a->f : a && a->kind == ATTR_INT ? (double)a->i : def;
}

const int64_t *ir_attr_ints(const Graph *g, const Node *n, const char *key, int *len)
{
    const Attr *a = find_attr(g, n, key);
    if (!a || a->kind != ATTR_INTS) {
        *len = 0;
        return NULL;
    }
    *len = a->n_list;
    return &g->ints[a->list];
}

/* A node's attributes as the op layer's shape rules read them. */
typedef struct {
    const Graph *g;
    const Node *n;
} NodeAttrs;

static int find_node_attr(const void *self, const char *key, OpAttr *out)
{
    const NodeAttrs *na = self;
    const Attr *a = find_attr(na->g, na->n, key);
    if (!a) return 0;
    *out = (OpAttr){.kind = a->kind == ATTR_INT ? OPA_INT : a->kind == ATTR_FLOAT ? OPA_FLOAT : OPA_INTS,
                    .i = a->i, .f = a->f, .ints = a->kind == ATTR_INTS ? &na->g->ints[a->list] : NULL,
                    .n_ints = a->kind == ATTR_INTS ? a->n_list : 0};
    return 1;
}

static OpType type_of(const Value *v)
{
    OpType t = {.dtype = v->dtype, .rank = v->rank};
    memcpy(t.shape, v->shape, sizeof t.shape);
    return t;
}

int ir_node_shape(const Graph *g, const Node *n, ShapeCtx *c, char *err, size_t errlen)
{
    NodeAttrs na = {g, n};
    *c = (ShapeCtx){.op = n->op, .attrs = {&na, find_node_attr}, .n_in = n->n_in, .err = err, .errlen = errlen};
    for (int i = 0; i < n->n_in; i++) c->in[i] = type_of(ir_value(g, ir_in(g, n, i)));
    int rc = op_shape(c);
    c->attrs = (OpAttrs){0};  // na is gone when this returns
    return rc;
}

int64_t ir_numel(const Value *v)
{
    int64_t n = 1;
    for (int i = 0; i < v->rank; i++) n *= v->shape[i];
    return n;
}

int64_t ir_logical_numel(const Value *v)
{
    return v->logical_rows && v->rank ? ir_numel(v) / v->shape[0] * v->logical_rows : ir_numel(v);
}

int ir_same_shape(const Value *a, const Value *b)
{
    return a->rank == b->rank && !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->rank);
}

int ir_group_last(const Graph *g, int n)
{
    int grp = g->nodes[n].group;
    while (grp >= 0 && n + 1 < g->n_nodes && g->nodes[n + 1].group == grp) n++;
    return n;
}

int64_t ir_nbytes(const Value *v) { return ir_numel(v) * dtype_size(v->dtype); }

char *ir_shape_str(const Value *v, char *buf, size_t len)
{
    OpType t = type_of(v);
    return op_shape_str(&t, buf, len);
}

char *ir_type_str(const Value *v, char *buf, size_t len)
{
    OpType t = type_of(v);
    return op_type_str(&t, buf, len);
}

/* The model's params, once each: not the flat buffers and shards the shard pass makes
 * to hold them (unnamed, or a unit's storage), nor second views of one (tied). */
static int64_t count_params(const Graph *g, int frozen_only)
{
    int64_t n = 0;
    for (int i = 0; i < g->n_values; i++) {
        const Value *v = &g->values[i];
        int storage = v->unit >= 0 && v->view_of < 0;
        if (v->role == ROLE_PARAM && v->tied_to < 0 && v->name && !storage && (v->frozen || !frozen_only))
            n += ir_logical_numel(v);
    }
    return n;
}

int64_t ir_param_count(const Graph *g) { return count_params(g, 0); }
int64_t ir_frozen_count(const Graph *g) { return count_params(g, 1); }

/* With no weight decay at all there is one trainable group: splitting it would only
 * cost collectives. */
ParamGroup ir_param_group(const Value *p, double weight_decay)
{
    return p->frozen ? GROUP_FROZEN : p->no_decay && weight_decay != 0 ? GROUP_NO_DECAY : GROUP_DECAY;
}

int ir_param_unit(const Graph *g, const Value *p, double weight_decay)
{
    int base = p->block >= 0 ? p->block : p->pipe_copy ? g->n_blocks + 1 : g->n_blocks;
    return (int)ir_param_group(p, weight_decay) * (g->n_blocks + 2) + base;
}

int ir_view_parent(const Graph *g, int v)
{
    const Value *val = ir_value(g, v);
    if (val->view_of >= 0) return val->view_of;
    if (val->producer < 0) return -1;
    const Node *n = ir_node(g, val->producer);
    return (op_info(n->op)->flags & OPF_VIEW) ? ir_in(g, n, 0) : -1;
}

void ir_value_take_over(Graph *g, int old, int now)
{
    Value v = g->values[old];
    v.producer = g->values[now].producer;
    g->values[now] = v;
    for (int k = 0; k < g->n_nodes; k++)
        for (int i = 0; i < g->nodes[k].n_in; i++)
            if (g->ids[g->nodes[k].in + i] == old) g->ids[g->nodes[k].in + i] = now;
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == old) g->outputs[i] = now;
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i].grad == old) g->values[i].grad = now;
}

void ir_inplace_bind(Graph *g, int n)
{
    const Node *x = ir_node(g, n);
    FS_ASSERT(op_info(x->op)->flags & OPF_INPLACE);
    Value *in = &g->values[ir_in(g, x, 0)];
    in->view_of = ir_out(g, x, x->n_out - 1);
    in->view_offset = in->view_rank_stride = 0;
}

void ir_nodes_reorder(Graph *g, const int *order)
{
    FS_ASSERT(!g->n_waits);  // the schedule's waits name node ids: it runs after every reorder
    Node *nodes = arena_alloc(g->arena, sizeof(Node) * (size_t)g->n_nodes + 1);
    int *pos = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_nodes + 1);
    for (int i = 0; i < g->n_nodes; i++) {
        FS_ASSERT(order[i] >= 0 && order[i] < g->n_nodes);
        nodes[i] = g->nodes[order[i]];
        pos[order[i]] = i;
    }
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].producer >= 0) g->values[v].producer = pos[g->values[v].producer];
    g->nodes = nodes;
    g->cap_nodes = g->n_nodes;
}

/* Every value id a graph holds outside the nodes' id lists, through vmap (-1: gone). */
static void remap_value_fields(Graph *g, const int *vmap)
{
#define MAP(x) ((x) >= 0 ? vmap[x] : (x))
    for (int v = 0; v < g->n_values; v++) {
        Value *val = &g->values[v];
        val->tied_to = MAP(val->tied_to), val->grad = MAP(val->grad);
        val->view_of = MAP(val->view_of), val->alias = MAP(val->alias);
        val->recompute_of = MAP(val->recompute_of), val->work = MAP(val->work);
    }
    for (int i = 0; i < g->n_outputs; i++) g->outputs[i] = MAP(g->outputs[i]);
    for (int i = 0; i < g->n_tied; i++) g->tied[i].value = MAP(g->tied[i].value);
    for (int i = 0; i < g->n_links; i++) g->links[i].value = MAP(g->links[i].value);
    g->loss_scale = MAP(g->loss_scale), g->scale_good = MAP(g->scale_good);
#undef MAP
}

void ir_graph_compact(Graph *g, const char *drop_node)
{
    FS_ASSERT(!g->n_waits);
    int *vmap = arena_alloc(g->arena, sizeof(int) * ((size_t)g->n_values + 1));
    int *nmap = arena_alloc(g->arena, sizeof(int) * ((size_t)g->n_nodes + 1));
    int nv = 0;
    for (int v = 0; v < g->n_values; v++) {
        int p = g->values[v].producer, gone = p >= 0 && drop_node[p];
        vmap[v] = gone ? -1 : nv;
        if (!gone) g->values[nv++] = g->values[v];
    }
    g->n_values = nv;
    remap_value_fields(g, vmap);
    /* Nodes keep their id ranges; the ids inside them are remapped. */
    int nn = 0;
    for (int n = 0; n < g->n_nodes; n++) {
        nmap[n] = drop_node[n] ? -1 : nn;
        if (drop_node[n]) continue;
        Node node = g->nodes[n];
        for (int k = 0; k < node.n_in; k++) {
            FS_ASSERT(vmap[g->ids[node.in + k]] >= 0);  // a kept node reads no dropped value
            g->ids[node.in + k] = vmap[g->ids[node.in + k]];
        }
        for (int k = 0; k < node.n_out; k++) {
            int v = vmap[g->ids[node.out + k]];
            g->ids[node.out + k] = v;
            g->values[v].producer = nn;
        }
        if (node.group >= 0) node.group = nmap[node.group];  // a group starts at a kept earlier node
        FS_ASSERT(node.group >= -1);
        g->nodes[nn++] = node;
    }
    g->n_nodes = nn;
    for (int i = 0; i < g->n_outputs; i++) FS_ASSERT(g->outputs[i] >= 0);
}

void ir_graph_drop_last(Graph *g, int n)
{
    FS_ASSERT(n >= 0 && n <= g->n_nodes);
    char *drop = arena_alloc(g->arena, (size_t)g->n_nodes);
    memset(drop, 0, (size_t)g->n_nodes);
    memset(drop + g->n_nodes - n, 1, (size_t)n);
    ir_graph_compact(g, drop);
}

int ir_node_retype(Graph *g, int n, char *err, size_t errlen)
{
    Node *node = &g->nodes[n];
    ShapeCtx c;
    if (ir_node_shape(g, node, &c, err, errlen) != 0) return -1;
    FS_ASSERT(c.n_out == node->n_out);
    for (int i = 0; i < c.n_out; i++) {
        Value *v = &g->values[ir_out(g, node, i)];
        v->dtype = c.out[i].dtype;
        v->rank = c.out[i].rank;
        memcpy(v->shape, c.out[i].shape, sizeof v->shape);
    }
    return 0;
}
