/* tests/cuda_emu/graph.c: --cuda-graph in cuda-emu: the step captured as the CUDA backend
 * captures it (runtime/cuda/run.c) and replayed.
 *
 * The capture holds the device's ops in plan order and each op of the host space
 * (offload's update and casts) as a host function node (cuLaunchHostFunc's CUhostFn and
 * its argument), whose edges are those run.c gives it: the copies its waits name, the
 * host node before it (the host stream), the step's start, and nothing of the device's
 * compute; each copy comes after every host node before it. The nodes are recorded in
 * the one order those edges allow that runs every host node as early as it can, ahead
 * of device ops the plan puts before it: what a GPU does when the host outruns the
 * device, so a wait the plan (or run.c) lacks shows as a replay whose result differs
 * from the step run in plan order. Nothing runs while it records; a replay runs the
 * nodes in their recorded order.
 */
#include <stdlib.h>

#include "emu_impl.h"

typedef struct {
    int32_t op;                // a device op (run_op's), or -1: a host function
    void (*fn)(void *data);
    void *data;
} Node;

typedef struct {
    EmuGraph *g;
    int32_t op;
} HostCall;

struct EmuGraph {
    Node *nodes;
    int32_t n;
    HostCall *calls;           // per op: a host function node's argument
    int (*host_op)(void *ctx, int32_t op);
    void *host_ctx;
    int32_t failed;            // the replay's host function whose op failed: its op + 1; 0
};

static void host_call(void *data)
{
    HostCall *c = data;
    if (c->g->host_op(c->g->host_ctx, c->op) && !c->g->failed) c->g->failed = c->op + 1;
}

/* Per host op: how many device ops its node follows (the latest its edges name). */
static int host_points(const CsSchedule *s, int32_t *dev_at, int32_t *after)
{
    int32_t n = s->n_ops, n_dev = 0;
    int32_t *copy_op = calloc((size_t)s->n_copies + 1, sizeof *copy_op);
    if (!copy_op) return -1;
    for (int32_t k = 0; k < n; k++) {
        if (s->ops[k].copy >= 0) copy_op[s->ops[k].copy] = k;
        n_dev += !s->ops[k].host;
        dev_at[k] = n_dev;  // device ops up to and with k
    }
    for (int32_t k = 0, last = 0; k < n; k++) {
        const CsOp *o = &s->ops[k];
        if (!o->host) continue;
        for (int32_t w = o->wait; w < o->wait + o->n_wait; w++) {
            int32_t e = s->waits[w], q = e < s->n_colls ? s->colls[e].op : copy_op[e - s->n_colls];
            if (dev_at[q] > last) last = dev_at[q];
        }
        after[k] = last;
    }
    free(copy_op);
    return n_dev;
}

EmuGraph *emu_graph_capture(const CsSchedule *s, int (*host_op)(void *ctx, int32_t op), void *host_ctx)
{
    int32_t n = s->n_ops, at = 0;
    EmuGraph *g = calloc(1, sizeof *g);
    int32_t *dev_at = calloc((size_t)n + 1, sizeof *dev_at), *after = calloc((size_t)n + 1, sizeof *after);
    int n_dev = -1;
    if (g && dev_at && after && (g->nodes = calloc((size_t)n + 1, sizeof *g->nodes)) &&
        (g->calls = calloc((size_t)n + 1, sizeof *g->calls)))
        n_dev = host_points(s, dev_at, after);
    if (n_dev >= 0) {
        g->host_op = host_op, g->host_ctx = host_ctx;
        for (int32_t d = 0, k = 0; d <= n_dev; d++) {  // the host nodes due after d device ops, then the next one
            for (int32_t h = 0; h < n; h++)
                if (s->ops[h].host && after[h] == d) {
                    g->calls[h] = (HostCall){g, h};
                    g->nodes[at++] = (Node){.op = -1, .fn = host_call, .data = &g->calls[h]};
                }
            while (k < n && s->ops[k].host) k++;
            if (k < n) g->nodes[at++] = (Node){.op = k++};
        }
        g->n = at;
    }
    free(dev_at), free(after);
    if (n_dev < 0 || at != n) {
        emu_graph_free(g);
        return NULL;
    }
    return g;
}

int emu_graph_replay(EmuGraph *g, int (*run_op)(void *ctx, int32_t op), void *ctx, int32_t *failed_op)
{
    g->failed = 0;
    for (int32_t i = 0; i < g->n; i++) {
        const Node *x = &g->nodes[i];
        if (x->fn) x->fn(x->data);
        else if (run_op(ctx, x->op)) return -1;
    }
    *failed_op = g->failed - 1;
    return g->failed ? -1 : 0;
}

void emu_graph_free(EmuGraph *g)
{
    if (!g) return;
    free(g->nodes);
    free(g->calls);
    free(g);
}
