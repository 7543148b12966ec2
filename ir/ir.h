/* ir/ir.h: the intermediate representation, and what every layer above it shares.
 *
 * One Graph per compilation. Values and nodes live in arrays and refer to each other by
 * integer id, never by pointer, so a graph prints, verifies and serializes without
 * fix-ups. Everything a graph owns (its arrays, names, attribute lists) comes from its
 * Arena and is freed at once by ir_graph_free.
 *
 * Where it sits: frontend (lower) builds a Graph; passes rewrite it; codegen turns it
 * into a plan. The op table, dtypes and shape rules are the op layer's (ops/ops.h), which
 * this header includes; the IR adds the hooks that need a graph (gradients, FLOPs).
 * This header is grouped by the file that defines each declaration.
 */
#ifndef FS_IR_H
#define FS_IR_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ops.h"

#define FS_VERSION "0.1.0"

/* ---- ir/arena.c: one allocation region per compilation, freed at once ---------- */

typedef struct Arena Arena;
Arena *arena_new(void);
void arena_free(Arena *a);
/* Zeroed memory; aborts the process with a message when the system is out of memory
 * (a compiler has nothing to save). */
void *arena_alloc(Arena *a, size_t n);
char *arena_strdup(Arena *a, const char *s);
char *arena_strndup(Arena *a, const char *s, size_t n);
char *arena_printf(Arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Grows an array kept in the arena to hold at least `need` items of `size` bytes;
 * `*cap` is its capacity in items. The old block is abandoned, not freed. */
void *arena_grow(Arena *a, void *p, int *cap, int need, size_t size);

/* ---- ir/diag.c: user-facing diagnostics, gcc style ------------------------------ */

/* A source span: 1-based line and column, length in bytes. line == 0: no location. */
typedef struct {
    int line, col, len;
} Loc;

enum { DIAG_MAX_ERRORS = 20 };

typedef struct Diag {
    const char *file;  // name printed before each message
    const char *src;   // source text, for the quoted line; may be NULL
    size_t src_len;
    FILE *out;         // where messages go (stderr in the tools, a memstream in tests)
    int n_errors, n_warnings;
    int stopped;       // DIAG_MAX_ERRORS reached: further errors are dropped
} Diag;

void diag_init(Diag *d, const char *file, const char *src, size_t src_len, FILE *out);
/* `file:line:col: error: msg`, then the source line and a caret under the span. */
void diag_error(Diag *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_warning(Diag *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_note(Diag *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_verror(Diag *d, Loc loc, const char *fmt, va_list ap);
/* The closest of `n` candidates to `name` by edit distance, or NULL if none is close. */
const char *diag_closest(const char *name, const char *const *cands, int n);

/* Internal errors: a broken invariant of the compiler itself, never a user error. */
#define FS_ASSERT(c)                                                                     \
    do {                                                                                 \
        if (!(c)) fs_internal_error(__FILE__, __LINE__, #c);                             \
    } while (0)
_Noreturn void fs_internal_error(const char *file, int line, const char *what);

/* ---- ir/types.c: roles, placements, phases (DType is ops/ops.h's) ------------------ */

typedef enum {
    ROLE_INPUT,      // a batch from the data loader
    ROLE_PARAM,      // a trainable weight
    ROLE_GRAD,       // gradient of a param
    ROLE_ACT,        // an activation or other intermediate
    ROLE_OPT_STATE,  // optimizer state (AdamW m, v; SGD momentum)
    ROLE_MASTER,     // fp32 master copy of a low-precision param
    ROLE_COMM,       // a buffer a collective reads or writes
    ROLE_SCRATCH,    // op workspace
    ROLE_CONST,      // a compile-time constant (scalar, arange)
    ROLE_GATHERED,   // a block's params all-gathered from their shards (fsdp)
    ROLE_KV_CACHE,   // a decode program's keys or values of every position so far (passes/decode.c)
    ROLE_PARAM16,    // the 16-bit working copy of fp32 params that their update writes (cast_in_update,
                     // passes/shard.c): kept between steps, made from the master at init and load, never saved
    ROLE_COUNT
} Role;
typedef enum { PLACE_DEVICE, PLACE_HOST, PLACE_COUNT } Placement;  // the memory space
/* The stream a node runs on (passes/schedule.c): compute, collectives, host-device copies. */
typedef enum { STREAM_COMPUTE, STREAM_COLLECTIVE, STREAM_COPY, STREAM_COUNT } Stream;
/* What the runtime's step loop needs a value for (plan.h's PlanStepRole): found by this
 * role, never by name. Set by the pass that makes the value. */
typedef enum {
    SR_NONE, SR_LOSS, SR_LR, SR_GRAD_NORM, SR_LOSS_SCALE, SR_STEP, SR_OPT_STEP, SR_LOSS_SEED, SR_RNG, SR_POS, SR_COUNT
} StepRole;
/* PHASE_WGRAD: the part of the backward that computes params' gradients only (the zero-
 * bubble schedule runs it apart from the rest, which computes the inputs' gradients). */
typedef enum {
    PHASE_FORWARD, PHASE_BACKWARD, PHASE_RECOMPUTE, PHASE_OPTIMIZER, PHASE_COMM, PHASE_WGRAD, PHASE_COUNT
} Phase;
typedef enum { INIT_NONE, INIT_ZEROS, INIT_ONES, INIT_NORMAL, INIT_UNIFORM, INIT_FULL, INIT_COUNT } InitKind;

const char *role_name(Role r);      // "input", "param", ...
const char *placement_name(Placement p);
const char *phase_name(Phase p);
const char *init_name(InitKind k);  // "zeros", "ones", "normal", "uniform", "full" (init_a)

/* ---- ir/ops.c: the IR's hooks of each op (the table itself is ops/ops.h's) ---------- */

#define IR_MAX_RANK OPS_MAX_RANK
#define IR_MAX_IN OPS_MAX_IN
#define IR_MAX_OUT OPS_MAX_OUT
#define IR_MAX_PARAMS OPS_MAX_PARAMS

typedef struct GradCtx GradCtx;
typedef struct Graph Graph;
typedef struct Node Node;

/* What only the IR can compute of an op: it needs the graph. */
typedef struct {
    double (*flops)(const Graph *g, const Node *n);
    int (*grad)(GradCtx *c);  // grad_none for ops no gradient flows through
} IrOpHooks;

/* Indexed by OpKind, like op_info. */
const IrOpHooks *ir_op_hooks(OpKind op);

/* ---- ir/graph.c: building and reading the graph ---------------------------------- */

typedef struct {
    DType dtype;
    int rank;
    int64_t shape[IR_MAX_RANK];  // elements along each dim; rank 0 is a scalar
    Role role;
    int block;                   // Graph.blocks index, -1 for none (the model's root)
    Placement place;
    const char *name;            // params and inputs: their full name ("h.3.attn.w")
    Loc loc;                     // the source that made it
    int producer;                // node id, -1 for inputs and params
    InitKind init;               // params: how they start
    double init_a, init_b;       // normal: (std, mean); uniform: (low, high)
    int tied_to;                 // value id of the param this one aliases, or -1
    int grad;                    // params, after autodiff: the value holding the gradient, or -1
    int64_t offset;              // after memplan: byte offset in the rank's arena
    int live_start, live_end;    // after memplan: first writer and last reader (node indices;
                                 // n_nodes: live to the end of the step)
    int alias;                   // after memplan: the root value whose buffer this lies in, or -1
    int64_t rank_stride;         // after memplan: bytes added to offset per rank
    /* Views and flat layouts, set by the shard pass (ir_value_add starts them unset). */
    int view_of;                 // the value whose buffer this lies in, or -1
    int64_t view_offset;         // bytes into view_of's buffer ...
    int64_t view_rank_stride;    // ... plus this many per rank (a rank's shard)
    int unit;                    // the flat unit (block; n_blocks: params outside blocks; n_blocks + 1: a
                                 // pipeline stage's copies of tied params), or -1
    int64_t flat_offset;         // elements: a param's start in its unit's flat layout, or a
                                 // storage's first element on rank 0
    int sharded;                 // holds only this rank's shard of its unit
    StepRole step_role;          // SR_NONE but for the few values the step loop reads or writes
    int recompute_of;            // a recompute copy (passes/recompute.c): the forward value it
                                 // recomputes, or -1
    int pipe_copy;               // a param another pipeline stage also holds (a tied embedding)
                                 // and counts in the global norm: this stage does not
    int frozen;                  // a param (or a unit's buffer) that gets no gradient, no
                                 // optimizer state and no update (`frozen`, `freeze`)
    int no_decay;                // a param (or a unit's buffer) the optimizer does not decay
                                 // (`no_decay`, `weight_decay_on matrices`)
    int work;                    // what an update writes besides (shard pass, cast_in_update): the 16-bit
                                 // working copy (ROLE_PARAM16) of this fp32 storage or shard, or -1
    int64_t logical_rows;        // a param the pad_vocab pass widened: the model's own dim 0 (its rows
                                 // [logical_rows, shape[0]) are padding, zero); 0: not padded
} Value;

typedef enum { ATTR_INT, ATTR_FLOAT, ATTR_INTS } AttrKind;

typedef struct {
    const char *key;
    AttrKind kind;
    int64_t i;
    double f;
    int list, n_list;    // ATTR_INTS: range in Graph.ints (set by ir_node_add)
    const int64_t *ints; // ATTR_INTS passed to ir_node_add: the n_list items to copy
} Attr;

struct Node {
    OpKind op;
    int block;          // -1 for none
    Phase phase;
    Loc loc;
    int in, n_in;       // range in Graph.ids: input value ids
    int out, n_out;     // range in Graph.ids: output value ids
    int attr, n_attr;   // range in Graph.attrs
    int group;          // after fuse: the first node of its fused elementwise group, or -1
    Stream stream;      // after schedule: the stream it runs on
    int wait, n_wait;   // after schedule: range in Graph.waits: earlier nodes off the
                        // compute stream that must be complete before it starts
    int mb;             // after pipeline: the micro-batch it works on, or -1 (the step's own)
    int chunk;          // a pipeline stage graph: the model chunk (virtual stage) it belongs to
    int use;            // a forward node of a block applied more than once (a shared instance,
                        // frontend/instance.c): which application, 0 for the first; copies keep it
};

typedef struct {
    const char *name;   // "h.3"
    const char *layer;  // "Block"
    int index;          // 3
} Block;

/* A value a stage graph's forward sends to or receives from another stage
 * (passes/stages.c): autodiff sends the gradient of each received value back, and seeds
 * the backward with the gradient each sent value gets back. */
typedef struct {
    int value;  // the sent value, or the received one (a recv's output)
    int peer;   // the other stage
    int sends;  // 1: this stage sends it; 0: receives it
    int tag;    // the model chunk that made it: the send's and recv's tag (the gradient
                // going back: tag + stages x chunks)
} PipeLink;

/* A param that several stages hold (a tied embedding): after the last micro-batch each
 * stage's gradient of it goes to every other, and each sums them in stage order. */
typedef struct {
    int value;          // the param in this stage graph
    int n_stages;
    const int *stages;  // the stages holding it, ascending (this one among them)
} TiedParam;

struct Graph {
    Arena *arena;
    const char *model;  // the model's name
    const char *dims;   // the model-level dims, "NAME=VALUE ..." in source order, global (before the
                        // batch is split over ranks); NULL in stage and decode graphs
    const char *batch_dim;  // the first dim of the first input when it is a dim name, or NULL
    Value *values;
    int n_values, cap_values;
    Node *nodes;
    int n_nodes, cap_nodes;
    int *ids;
    int n_ids, cap_ids;
    Attr *attrs;
    int n_attrs, cap_attrs;
    int64_t *ints;
    int n_ints, cap_ints;
    Block *blocks;
    int n_blocks, cap_blocks;
    int *outputs;       // value ids the step produces; outputs[0] is the loss
    int n_outputs, cap_outputs;
    int *waits;         // node ids, for Node wait ranges (schedule)
    int n_waits, cap_waits;
    int planned;                        // memplan ran: offsets and space_bytes hold
    int64_t space_bytes[PLACE_COUNT];   // after memplan: each space's arena, per rank
    int loss_scale;       // fp16: the dynamic loss scale (f32 [] state), or -1
    int scale_good;       // fp16: steps since the scale last changed (i32 [] state), or -1
    /* Pipeline stages (passes/stages.c). The graph fe_compile made holds, once the
     * stages pass has run with stages > 1, one graph per stage, which the later passes
     * rewrite each on its own; a stage graph knows its place and its links. */
    Graph **stage_graphs;  // the compiled graph: its stages, or NULL
    int n_stage_graphs;
    int stage, n_stages;   // a stage graph: stage `stage` of n_stages (else 0 of 1)
    int n_chunks;          // a stage graph: model chunks per stage (interleaved; else 1); chunk c
                           // (Node.chunk, 0 .. n_stages x n_chunks - 1) is on stage c % n_stages
    PipeLink *links;       // a stage graph: the forward's sends and receives, in order
    int n_links, cap_links;
    TiedParam *tied;       // a stage graph: params other stages hold too
    int n_tied, cap_tied;
};

Graph *ir_graph_new(const char *model);
void ir_graph_free(Graph *g);

/* Adds a value that no node produces (input, param, const); returns its id. */
int ir_value_add(Graph *g, const Value *v);
int ir_block_add(Graph *g, const char *name, const char *layer, int index);
void ir_output_add(Graph *g, int value);

/* Adds node `op` with inputs `in` and attributes `attrs`, then runs the op's shape rule,
 * which creates the outputs (role ROLE_ACT, the node's block and loc). Returns the node
 * id; or -1 with a message in `err` (the graph is then unchanged). */
int ir_node_add(Graph *g, OpKind op, const int *in, int n_in, const Attr *attrs, int n_attr,
                int block, Phase phase, Loc loc, char *err, size_t errlen);

/* Puts the nodes in `order` (a permutation of the node ids, which then become the
 * positions); values keep their ids. The new order must respect every dependency. */
void ir_nodes_reorder(Graph *g, const int *order);
/* Removes the nodes with drop_node[n] set and their outputs, renumbering the rest in
 * their order. No kept node may read a removed value (FS_ASSERT): the caller has rewired
 * its uses. Value fields that name a removed value (grad, tied_to, view_of, alias)
 * become -1. */
void ir_graph_compact(Graph *g, const char *drop_node);
/* ir_graph_compact of the last n nodes: what a rewrite that reorders its replaced nodes
 * to the end (ir_nodes_reorder) then drops. */
void ir_graph_drop_last(Graph *g, int n);
/* A rewrite's new value `now` stands for `old`: it takes old's fields (name, role, step
 * role ...) but its producer, and every node input, step output and param gradient that
 * named old names now. old is then read by nothing. */
void ir_value_take_over(Graph *g, int old, int now);
/* Node n (OPF_INPLACE) writes its last output over its first input: the input becomes a
 * view at the output's first byte, so memplan gives them one buffer, the output's (whose
 * role, a gradient's, the memory report counts), and a later layout of the output (a
 * flat gradient buffer) takes the input with it. */
void ir_inplace_bind(Graph *g, int n);
/* Runs node n's shape rule again on its current inputs and retypes its outputs in place
 * (after a pass changed the dtype of an input). 0, or -1 with the rule's message. */
int ir_node_retype(Graph *g, int n, char *err, size_t errlen);

static inline const Value *ir_value(const Graph *g, int id) { return &g->values[id]; }
static inline const Node *ir_node(const Graph *g, int id) { return &g->nodes[id]; }
static inline int ir_in(const Graph *g, const Node *n, int i) { return g->ids[n->in + i]; }
static inline int ir_out(const Graph *g, const Node *n, int i) { return g->ids[n->out + i]; }
/* Typed attribute getters; the default when the node has no such key. */
int64_t ir_attr_int(const Graph *g, const Node *n, const char *key, int64_t def);
double ir_attr_float(const Graph *g, const Node *n, const char *key, double def);
/* The list and its length (0 and NULL when absent). */
const int64_t *ir_attr_ints(const Graph *g, const Node *n, const char *key, int *len);
/* Node n's attributes as ir_node_add takes them (lists pointing into g) into out, which
 * holds IR_MAX_PARAMS; returns how many: for a copy of n, in g or another graph. */
int ir_node_attrs(const Graph *g, const Node *n, Attr *out);

int64_t ir_numel(const Value *v);
/* The elements of the model's own tensor: ir_numel less a padded param's padding rows
 * (Value.logical_rows), which are the last elements of its row-major storage. */
int64_t ir_logical_numel(const Value *v);
int ir_same_shape(const Value *a, const Value *b);
/* The value whose buffer v lies in directly: an explicit view (Value.view_of: the shard
 * pass's, or the input an OPF_INPLACE op writes over, which lies in its output) or the
 * input of the OPF_VIEW op that made it; -1 for a value with bytes of its own. */
int ir_view_parent(const Graph *g, int v);
/* The last node of node n's fused group (passes/fuse.c: consecutive nodes), or n. */
int ir_group_last(const Graph *g, int n);
int64_t ir_nbytes(const Value *v);
/* "f32[4, 64, 768]" into buf; returns buf. */
char *ir_type_str(const Value *v, char *buf, size_t len);
/* "[4, 64, 768]" into buf; returns buf. */
char *ir_shape_str(const Value *v, char *buf, size_t len);
/* Parameter elements (tied params counted once): all of them, and the frozen ones. */
int64_t ir_param_count(const Graph *g);
int64_t ir_frozen_count(const Graph *g);
/* A param's optimizer group (passes/shard.c flattens each group of a block apart, as
 * DeepSpeed flattens each param group): decayed, not decayed, frozen. */
typedef enum { GROUP_DECAY, GROUP_NO_DECAY, GROUP_FROZEN, GROUP_COUNT } ParamGroup;
ParamGroup ir_param_group(const Value *p, double weight_decay);
/* The flat unit of param p (Value.unit, passes/shard.c): group x (n_blocks + 2) + its
 * block, n_blocks for the params outside blocks, n_blocks + 1 for a pipeline stage's
 * copies of tied params. Units number below ir_unit_count. */
int ir_param_unit(const Graph *g, const Value *p, double weight_decay);
static inline int ir_unit_count(int n_blocks) { return GROUP_COUNT * (n_blocks + 2); }

/* Runs node n's shape rule (ops/shape.c) on its inputs and attributes, with err as the
 * message buffer; 0 with c->out filled, or -1. */
int ir_node_shape(const Graph *g, const Node *n, ShapeCtx *c, char *err, size_t errlen);

/* ---- ir/flops.c: forward FLOP counts, one per op -------------------------------- */
#define OP(name, ...) double flops_##name(const Graph *g, const Node *n);
#include "ops.def"
#undef OP
/* The part of node n's FLOPs that redoes forward work: all of a recompute node's, and
 * the Q K^T attention's backward computes again; 0 for any other node. */
double ir_node_redone_flops(const Graph *g, const Node *n);

/* ---- ir/grad.c: gradient rules (grad_GRAD, named by ops.def's grad column) --------- */

struct GradCtx {
    Graph *g;
    int node;                // the forward node
    int dout[IR_MAX_OUT];    // the gradient of each output, -1 when none flows
    int need[IR_MAX_IN];     // whether input i needs a gradient
    int din[IR_MAX_IN];      // to fill: the gradient of each needed input, or -1
};
#define OP(name, n_out, flags, sig, grad, ...) int grad_##grad(GradCtx *c);
#include "ops.def"
#undef OP

/* ---- ir/config.c: training settings, from the `train` section and the command line -- */

typedef enum { SHARD_NONE, SHARD_DDP, SHARD_ZERO1, SHARD_ZERO2, SHARD_FSDP, SHARD_COUNT } ShardKind;
typedef enum { PREC_FP32, PREC_FP16, PREC_BF16, PREC_COUNT } Precision;
/* The dtype gradients are reduced in: the compute dtype (FairScale's default), or fp32
 * (its fp32_reduce_scatter); fp16 / bf16 name the compute dtype explicitly. */
typedef enum { REDUCE_COMPUTE, REDUCE_FP32, REDUCE_FP16, REDUCE_BF16, REDUCE_COUNT } ReduceDtype;
typedef enum { OPTIM_SGD, OPTIM_ADAMW, OPTIM_COUNT } OptimKind;
typedef enum { OFFLOAD_NONE, OFFLOAD_OPTIMIZER, OFFLOAD_PARAMS, OFFLOAD_COUNT } OffloadKind;
typedef enum { SCHED_GPIPE, SCHED_1F1B, SCHED_INTERLEAVED, SCHED_ZB1, SCHED_COUNT } PipeSchedule;
/* Which micro-batches keep only their stage's inputs and recompute its forward in the
 * backward (FairScale Pipe's `checkpoint`). */
typedef enum { CKPT_ALWAYS, CKPT_EXCEPT_LAST, CKPT_NEVER, CKPT_COUNT } PipeCheckpoint;
typedef enum { LR_CONSTANT, LR_COSINE, LR_LINEAR, LR_WSD, LR_COUNT } LrSchedule;  // ops.h's OPS_LR_*

typedef struct {
    OptimKind optimizer;
    double lr, beta1, beta2, eps, weight_decay, momentum;
    double clip;          // clip grads to this global norm; 0: off
    LrSchedule lr_schedule;
    int warmup;           // steps of linear warmup
    double min_lr;        // the decay ends at this
    int steps;            // the schedule's length
    double decay_frac;    // wsd: the fraction of `steps` that decays
    Precision precision;
    ReduceDtype reduce_dtype;  // dtype grads are reduced in
    ShardKind shard;
    int reshard_after_forward;
    int reshard_root;     // fsdp: the params outside blocks gathered per stretch between blocks (1) or kept (0)
    int shard_group;      // zero1/zero2/fsdp: ranks a shard is split over (HYBRID_SHARD); 0: all D
    int world;
    char recompute[256];  // "none", "all" or comma-separated layer names
    char freeze[256];     // "none", or comma-separated params, layer instances, layers
    int decay_matrices;   // weight_decay_on matrices: only params of 2 or more dims decay
    int stages, microbatches;
    PipeSchedule schedule;
    PipeCheckpoint checkpoint;
    int fuse_loss;        // passes/xent.c: cross_entropy and its backward as one op (1), or apart (0)
    int embed_grad_into;  // passes/embed_into.c: an embedding's gradient rows added in place (1), or not (0)
    int pad_vocab;        // passes/pad_vocab.c: a classifier's vocabulary rows padded to a multiple of this; 0: off
    int pack_attention;   // passes/packed_attn.c: attention on the QKV projection's output as it lies (1), or not (0)
    int fuse_gemm;        // passes/epilogue.c: bias, GELU and their gradients in the GEMMs' epilogues (1), or apart (0)
    int slice_views;      // passes/slice_view.c: a slice of one run of its input bytes is a view (1), a copy (0)
    int fuse_residual;    // passes/epilogue.c, with fuse_gemm: residual adds in their GEMM or norm backward (1), or not (0)
    int tf32;             // CUDA: f32 attention (codegen/cuda_flash.c) and f32 GEMMs (fsexec) on TF32 tensor cores
    int cast_in_update;   // passes/shard.c: the update writes the 16-bit params it casts the master to (1), or a cast
                          // per unit makes them before their first use each step (0)
    int chunks;           // interleaved: model chunks per stage
    char balance[256];    // "auto", or blocks per stage: "3,3,2"

    OffloadKind offload;
    int delayed_update;   // offload: step t's host update runs during step t+1 (ZeRO-Offload's DPU; passes/offload.c)
    uint64_t seed;
    Loc optimizer_loc;    // the train block's `optimizer` statement (none when not there):
                          // the source the optimizer's own ops (norm, lr, clipping) name
} TrainConfig;

typedef struct {
    const char *key;   // the `train` section's name and the `--key` on the command line
    const char *help;  // one line, for --help
} ConfigKey;

void config_default(TrainConfig *c);
/* Sets `key` from text; on a bad key or value returns -1 with a message (naming the
 * closest key or the accepted values) in err. */
int config_set(TrainConfig *c, const char *key, const char *value, char *err, size_t errlen);
/* The keys config_set accepts, for help text and suggestions. */
const ConfigKey *config_keys(int *n);
/* The value of setting `key` in c as config_set would read it back ("0.001", "fsdp");
 * -1 for an unknown key. */
int config_format(const TrainConfig *c, const char *key, char *buf, size_t len);
/* Printable settings: "fsdp", "bf16", ... */
/* The ranks a unit is sharded over (shard_group, or all `world` of them when unset);
 * inside the passes `world` is a stage's data-parallel ranks D. */
int config_shard_group(const TrainConfig *c);
const char *shard_name(ShardKind s);
const char *precision_name(Precision p);
DType precision_dtype(Precision p);  // the compute dtype: f32, f16, bf16
const char *reduce_name(ReduceDtype r);
const char *optim_name(OptimKind o);
const char *offload_name(OffloadKind o);
const char *sched_name(PipeSchedule s);
const char *checkpoint_name(PipeCheckpoint c);
/* Whether pipeline micro-batch m keeps only its stage's inputs and recomputes the
 * stage's forward in its backward (checkpoint always; except_last: all but the last). */
int checkpoint_recomputes(const TrainConfig *t, int m);
/* `recompute`, per block (ir/config.c): a comma-separated list of items, each a target
 * (all, a layer: Block, an instance: h.3, or a range of instances: h.0-5, which is h.0 to
 * h.5), full by default or prefixed `attention:` for the attention core alone (Megatron's
 * selective recompute); `attention` alone is attention:all. A full item wins over an
 * attention one; none: nothing. */
typedef enum { RC_NONE, RC_ATTENTION, RC_FULL, RC_COUNT } RecomputeMode;
RecomputeMode recompute_mode(const char *list, const Block *b);
/* One item of the list (len bytes at item): whether it asks for the attention core only
 * (*attention), and whether its target names block b. */
int recompute_item_names(const char *item, size_t len, const Block *b, int *attention);
/* Whether an item's target is well formed: all, a name, or NAME.A-B with A <= B; 0 or
 * -1 with why in err. */
int recompute_item_check(const char *item, size_t len, char *err, size_t errlen);
const char *lr_schedule_name(LrSchedule s);
const char *decay_on_name(int matrices);  // weight_decay_on: "all" or "matrices"

/* ---- ir/verify.c ------------------------------------------------------------------ */

/* Checks every structural invariant (ids in range, each value produced once and before
 * use, outputs typed as the shape rule says). Returns 0, or -1 after printing what is
 * broken to `out`. */
int ir_verify(const Graph *g, FILE *out);

/* ---- ir/print.c and ir/json.c ------------------------------------------------------ */

/* The stable text form of `fsc --emit ir`. */
void ir_print(const Graph *g, FILE *out);
/* The same as JSON (`--emit ir-json`); returns 0 or -1. */
int ir_print_json(const Graph *g, FILE *out);

#endif
