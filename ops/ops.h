/* ops/ops.h: the op table, and what the compiler, the plan's readers and the runtime
 * all know of an op without an IR: dtypes, names, arity, signatures, flags, what it
 * communicates, and its shape rule.
 *
 * The bottom layer: it depends on libc alone. The IR (ir/) adds what needs a graph
 * (gradient rules, FLOP counts); the runtime and the reports read this layer and never
 * the IR. Shape rules see tensors as OpTypes (dtype, rank, shape) and attributes through
 * an OpAttrs accessor, so ir_node_add and fsexec's plan check run the same rule on an
 * IR node and on a plan op. This header is grouped by the file that defines each
 * declaration.
 */
#ifndef FS_OPS_H
#define FS_OPS_H

#include <stddef.h>
#include <stdint.h>

/* ---- ops/types.c: dtypes -------------------------------------------------------- */

/* Numbered as the plan's PlanDType (runtime/opcheck.c holds them equal). */
typedef enum { DT_F32, DT_F16, DT_BF16, DT_I32, DT_COUNT } DType;

const char *dtype_name(DType t);    // "f32", "f16", "bf16", "i32"
int dtype_size(DType t);            // bytes per element
int dtype_is_float(DType t);
int dtype_parse(const char *s, DType *out);  // 0 on success

/* ---- ops/ops.c: the op table, generated from ops/ops.def -------------------------- */

enum {
    OPF_ELEMWISE = 1, OPF_REDUCE = 2, OPF_VIEW = 4, OPF_LAYOUT = 8, OPF_HIDDEN = 16, OPF_SAVES = 32, OPF_EFFECT = 64,
    OPF_COLLECTIVE = 128, OPF_P2P = 256, OPF_COPY = 512, OPF_INPLACE = 1024
};

/* What an op moves between ranks or memory spaces (ops.def's last column). The
 * collectives are numbered as the runtimes' RtCollKind and CsCollKind, which switch on
 * them (static asserts there); a new kind (send, recv, a host-device copy) goes after
 * them, and rt_coll_kind / cs_coll_kind answer -1 for it until the runtime runs it. */
typedef enum {
    COMM_NONE = -1, COMM_ALL_REDUCE, COMM_REDUCE_SCATTER, COMM_ALL_GATHER, COMM_SEND, COMM_RECV, COMM_TO_HOST, COMM_TO_DEVICE,
    COMM_COUNT
} OpComm;
/* A collective's `group` attribute: over which ranks it runs. */
enum { OP_GROUP_DATA = 0, OP_GROUP_PIPE = 1, OP_GROUP_SHARD = 2, OP_GROUP_REPLICA = 3, OP_GROUP_COUNT };

typedef enum {
#define OP(name, ...) OP_##name,
#include "ops.def"
#undef OP
    OP_COUNT
} OpKind;

/* The input of an update that it writes without reading: adamw_cast's and sgd_cast's w, the
 * 16-bit copy it makes of the params it updated (ops.def); -1 for any other op. */
static inline int ops_update_copy_input(OpKind k) { return k == OP_adamw_cast ? 7 : k == OP_sgd_cast ? 6 : -1; }
/* Whether k is an optimizer update (adamw, sgd, and their forms that also write the 16-bit params). */
static inline int ops_is_update(OpKind k)
{
    return k == OP_adamw || k == OP_sgd || k == OP_adamw_cast || k == OP_sgd_cast;
}

#define OPS_MAX_RANK 6
#define OPS_MAX_IN 16
#define OPS_MAX_OUT 16
#define OPS_MAX_PARAMS 16  // parameters in one op signature
/* cross_entropy's mean over rows is a sum in f64 in one order on every backend: the rows
 * in OPS_LOSS_BLOCKS consecutive blocks of ceil(rows / OPS_LOSS_BLOCKS), each block's
 * terms added in row order, then the blocks' sums in order. Its second output, (rows, 2)
 * f32, holds each row's logsumexp and target logit, so a backend can compute the terms
 * in parallel and still add them in that order. */
#define OPS_LOSS_BLOCKS 64
/* cross_entropy's ignore_index when none is given: outside i32, so no target equals it.
 * With one inside i32 (ops_ignores), a row whose target is it counts for nothing: the mean
 * is over the other rows (their count, an exact integer, divides the f64 sum), the row's
 * terms are 0 and its gradient 0. With every row ignored the loss is 0 and every gradient 0
 * (PyTorch's 0/0 is NaN): a micro-batch or a rank whose targets are all ignored adds nothing
 * to its step (passes/xent_count.c: the step's mean is over the global batch's count). */
#define OPS_NO_IGNORE (-2147483649LL)
static inline int ops_ignores(int64_t ignore_index)
{
    return ignore_index >= -2147483648LL && ignore_index <= 2147483647LL;
}
/* lr_at's schedules (the `schedule` attribute; ir/config.c names them). */
enum { OPS_LR_CONSTANT, OPS_LR_COSINE, OPS_LR_LINEAR, OPS_LR_WSD, OPS_LR_COUNT };
/* Where a schedule's decay starts and how many steps it lasts, for warmup W, length N
 * (`steps`) and wsd's decay_frac f: cosine and linear decay from step W over max(1, N - W)
 * steps; wsd holds lr until S = max(W, N - floor(f N + 1/2)), then decays linearly over
 * max(1, N - S) steps. Every backend's lr_at reads these numbers from here. */
static inline void ops_lr_decay(int schedule, int64_t warmup, int64_t steps, double decay_frac, int64_t *start,
                                int64_t *len)
{
    *start = warmup;
    if (schedule == OPS_LR_WSD) {
        int64_t decay = (int64_t)(decay_frac * (double)steps + 0.5);  // decay_frac >= 0: round half up
        *start = steps - decay > warmup ? steps - decay : warmup;
    }
    *len = steps - *start > 1 ? steps - *start : 1;
}
/* The gradient norm's first stage (sumsq_parts): a flat gradient's sum of squares in
 * chunks of this many elements, one f32 part each (the last chunk shorter), each summed in
 * f64 in a fixed order; sum_parts adds the parts in order. So the norm is one launch per
 * flat unit plus one per 16 units, fixed-order on every backend, and a tensor's parts do
 * not depend on where it sits or on the thread count. */
#define OPS_SUMSQ_CHUNK 4096
/* The most members, and the most distinct inputs from outside, of one fused group of
 * elementwise ops (passes/fuse.c): one CUDA kernel's parameters (codegen/cuda_elementwise.c). */
#define OPS_FUSE_MAX 64

typedef enum { ARG_TENSOR, ARG_TENSORS, ARG_INT, ARG_FLOAT, ARG_INTS, ARG_FLAG } ArgKind;

/* One parameter of an op's signature, parsed from its ops.def string. */
typedef struct {
    const char *name;
    ArgKind kind;
    int has_default;
    double def;  // the default of an int, float or flag parameter
} OpParam;

typedef struct ShapeCtx ShapeCtx;

typedef struct {
    const char *name;
    int n_out;  // -1: decided by the shape rule
    int flags;
    OpComm comm;
    const char *sig;
    OpParam params[OPS_MAX_PARAMS];
    int n_params;
    int n_tensors;  // tensor parameters; -1 when variadic
    int (*shape)(ShapeCtx *c);
} OpInfo;

/* The table, indexed by OpKind; signatures parsed on first use (a malformed ops.def
 * row aborts with a message: a bug, caught by the first test). */
const OpInfo *op_info(OpKind op);
/* OP_COUNT when no op has that name. */
OpKind op_lookup(const char *name);
/* op_info of the op named `name` (a plan stores ops by name), or NULL. */
const OpInfo *op_info_by_name(const char *name);
const char *op_name(OpKind op);
/* The signature parameter that attribute `key` binds to, or -1 (tensors never match). */
int op_param_index(const OpInfo *info, const char *key);
/* The collective op `name` is (COMM_ALL_REDUCE ...), or COMM_NONE for any other name. */
OpComm op_comm_by_name(const char *name);
/* The name of the op that does `k` ("all_reduce"), or "?". */
const char *op_comm_name(OpComm k);

/* ---- ops/shape.c: types and attributes as shape rules see them --------------------- */

/* A tensor's type: what a shape rule reads of an input and writes of an output. */
typedef struct {
    DType dtype;
    int rank;
    int64_t shape[OPS_MAX_RANK];  // elements along each dim; rank 0 is a scalar
} OpType;

typedef enum { OPA_INT, OPA_FLOAT, OPA_INTS } OpAttrKind;

/* One attribute's value. */
typedef struct {
    OpAttrKind kind;
    int64_t i;
    double f;
    const int64_t *ints;  // OPA_INTS: n_ints items
    int n_ints;
} OpAttr;

/* An op's attributes, wherever they are kept (an IR node, a plan op): find fills *out
 * with attribute `key` and returns 1, or returns 0 when the op has none by that key. */
typedef struct {
    const void *self;
    int (*find)(const void *self, const char *key, OpAttr *out);
} OpAttrs;

/* Typed getters; the default when there is no such key. An int read as a float and a
 * float read as an int convert. */
int64_t op_attr_int(const OpAttrs *a, const char *key, int64_t def);
double op_attr_float(const OpAttrs *a, const char *key, double def);
/* The list and its length (0 and NULL when absent). */
const int64_t *op_attr_ints(const OpAttrs *a, const char *key, int *len);

int64_t op_type_numel(const OpType *t);
int op_type_same_shape(const OpType *a, const OpType *b);
/* "f32[4, 64, 768]" into buf; returns buf. */
char *op_type_str(const OpType *t, char *buf, size_t len);
/* "[4, 64, 768]" into buf; returns buf. */
char *op_shape_str(const OpType *t, char *buf, size_t len);

/* ---- ops/feed.c: the inputs fsexec can feed from --data --------------------------- */

/* Whether fsexec cannot feed a data input of this type from --data (one without a step
 * role): 1 with why into `why`, else 0. */
int op_input_unfed(const OpType *input, char *why, size_t len);

/* ---- ops/shape.c, ops/shape_bwd.c: shape rules, one per op (shape_NAME) ------------ */

struct ShapeCtx {
    OpKind op;
    OpAttrs attrs;
    OpType in[OPS_MAX_IN];      // the inputs' types
    int n_in;
    OpType out[OPS_MAX_OUT];    // to fill: dtype, rank, shape
    int n_out;                  // set from the table by op_shape; the rule sets it when -1
    char *err;
    size_t errlen;
};
/* Runs c->op's rule on c->in and c->attrs: 0 with c->out and c->n_out filled, or -1 with
 * a message in c->err that starts with the op's name. */
int op_shape(ShapeCtx *c);
/* Formats an error into c->err and returns -1, for `return shape_fail(c, ...)`. */
int shape_fail(ShapeCtx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Sets output i's dtype and shape. */
void shape_set(ShapeCtx *c, int i, DType dt, int rank, const int64_t *shape);
#define OP(name, ...) int shape_##name(ShapeCtx *c);
#include "ops.def"
#undef OP

#endif
