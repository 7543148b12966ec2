/* runtime/runtime.h: fsexec's side of the plan. It loads a plan (plan/plan.h: checked,
 * never trusted), reports what it holds, and runs its static schedule step after step
 * on the CPU backend (runtime/cpu/) of one rank: one arena carved by the plan's offsets,
 * params from a counter-based RNG, batches from token files or synthetic data. A world of
 * more than one rank, started by an MPI launcher (rank.c), runs one program per pipeline
 * stage (the plan's stages x data-parallel ranks: rank r is stage r / dp, data-parallel
 * index r % dp), each stage's ranks the same one, with collectives, sends and receives
 * over MPI (comm.c); the CUDA backend (backend.h) runs plans of one stage. Grouped by the
 * file that defines each declaration.
 */
#ifndef FS_RUNTIME_H
#define FS_RUNTIME_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "plan.h"

/* The version of fsexec; the same as FS_VERSION in ir/ir.h (a unit test holds them
 * equal), kept here because the runtime does not depend on the compiler. */
#define RT_VERSION "0.1.0"

/* ---- runtime/inspect.c: fsexec --inspect ------------------------------------------- */

/* What a plan holds, for people: format version, model, compiler, training settings,
 * ranks, the arena, parameters (count, bytes by dtype), inputs and outputs, blocks,
 * an op histogram, tensors by role with bytes, the memory report (report/, the same
 * as fsc --mem prints) and the section table. The plan must have passed plan_check
 * (plan_read does that). */
void rt_inspect(const Plan *p, FILE *out);

/* ---- runtime/init.c: parameter init, counter-based RNG -------------------------------- */

/* Philox4x32-10: four random words from a 64-bit key and a 128-bit counter. */
void rt_philox(uint64_t key, const uint32_t ctr[4], uint32_t out[4]);
/* FNV-1a 64 of a NUL-terminated string (a param's full name). */
uint64_t rt_fnv1a(const char *s);
/* A double in [0, 1) from 53 bits of (hi, lo). */
double rt_unit(uint32_t hi, uint32_t lo);
/* N(0, 1) by Box-Muller from the four words of one counter block. */
double rt_normal(const uint32_t w[4]);
/* Elements [first, first + count) of the param `name` initialized by `kind` (normal:
 * std a, mean b; uniform: [a, b)): element i is drawn from Philox(key = seed, counter = (i,
 * fnv1a(name))), so a slice equals the same slice of the whole tensor, whatever the
 * thread count. */
void rt_init_param(const char *name, uint64_t seed, PlanInit kind, double a, double b, int64_t first, int64_t count,
                   float *out);

/* Flat layouts (the shard pass): the params of a unit (a block, or the params outside
 * blocks) are views into one flat buffer, each at its flat_offset; the unit's STORAGE
 * is a root f32 param tensor with that unit, holding the whole buffer or (sharded) only
 * this rank's contiguous shard. The views may be 16-bit (fsdp's gathered compute copy);
 * init, save and load go through the f32 storage. */
/* Whether tensor id is a unit's storage: a root param tensor with a unit that is sharded
 * or has param views (rt_flat_is_param) in it. */
int rt_flat_is_storage(const Plan *p, int32_t id);
/* A model param inside unit u's flat layout: a named param view at its flat_offset (not
 * a rank's shard view, not the storage, not tied). fsdp plans may hold two views of one
 * param (gathered for forward and again for backward): same name, same flat range. */
int rt_flat_is_param(const PlanTensor *t, int32_t unit);
/* The flat elements [*first, *first + *count) that `storage` holds on `rank`. */
void rt_flat_held(const PlanTensor *storage, int rank, int64_t *first, int64_t *count);
/* Elements of the unit's whole flat layout: past the last param and the storage's reach. */
int64_t rt_flat_length(const Plan *p, int32_t storage, int world);
/* Fills the storage's bytes on `rank` (f32, *count elements): each param view of its
 * unit, intersected with the held range, from rt_init_param (so a shard equals the same
 * slice of the unsharded tensors); everything else (padding) zero. */
int rt_flat_init(const Plan *p, int32_t storage, int rank, uint64_t seed, float *out, char *err, size_t errlen);

/* Which flat elements of a unit each rank holds authoritatively after a step: rank r's
 * are [flat_first + r * flat_stride, + count), at arena bytes byte_offset + r *
 * byte_stride on that rank. A sharded storage: its own shard. A full buffer with a
 * rank-strided view (zero1, zero2: the shard each rank updates; the rest of the buffer
 * is refreshed by the all-gather of the next step): that view's range. Else (ddp, world
 * 1) every rank holds the same whole buffer: replicated, read it on rank 0. */
typedef struct {
    int64_t flat_first, flat_stride, count;
    int64_t byte_offset, byte_stride;
    int replicated;
} RtOwned;
void rt_flat_owned(const Plan *p, int32_t storage, int world, RtOwned *o);

/* ---- runtime/opcheck.c, runtime/opcheck_mem.c: a plan against the op table ------------- */

/* Whether any kernel could refuse the plan: plan_check, then the layout, then every op
 * against the op table (arity, attributes, dims, the op's shape rule (ops/) over the plan's
 * dtypes and shapes, what each kernel asks beyond it), then the values kernels index with
 * (rt_plan_check_values). 0, or -1 with a message naming the op ("op 17 (matmul): dtypes
 * differ: f32[8, 16] and bf16[16, 48]"). rt_exec_new runs it; so should anything else
 * that accepts a plan. */
int rt_plan_check_ops(const Plan *p, char *err, size_t errlen);
/* The same for one stage's program p of the plan `whole` (plan_extract_program; NULL: p
 * is all of it): the data inputs and their bounds are whole's. */
int rt_plan_check_stage(const Plan *p, const Plan *whole, char *err, size_t errlen);
/* Meta "world" (every stage's ranks: the stages, meta "stages" or 1, times the program's
 * dp_world); every tensor inside the arena on every rank, aligned,
 * views inside their roots, live ranges inside the ops. Needs plan_check. */
int rt_plan_check_layout(const Plan *p, char *err, size_t errlen);
/* Indices (embedding, cross_entropy and their backward ops), adamw's step and the i32
 * counters are proved in range from where they come from and that nothing overwrites
 * them before they are read; no output overlaps an input its kernel does not share
 * bytes with; effect ops update only persistent state. Needs the ops checked. whole:
 * the plan p is a stage of (its data inputs are whole's), or NULL. */
int rt_plan_check_values(const Plan *p, const Plan *whole, char *err, size_t errlen);

/* ---- runtime/exec.c: the executor of one rank (CPU backend) -------------------------- */

typedef struct Exec Exec;



typedef struct {
    uint64_t seed;   // parameter init
    int nan_fill;    // debug: fill every buffer with NaN outside its planned live range
    int guard;       // debug: check that every op writes only its own buffers (guard.c)
    int mirror;      // a device's host mirror: allocates only what the host reads or writes
                     // (each space's persistent prefix, the step's outputs), runs no op
    int rank, world; // this rank's data-parallel index among the world ranks of its stage
                     // (0 and 0 or 1: a world of one); world must be the program's
                     // dp_world; world > 1 runs collectives through MPI (rt_comm_init first)
    const Plan *whole;  // a pipeline: the plan of every stage, whose program `stage` the
                        // Exec's plan is (plan_extract_program); NULL: the plan is all of it
    int stage;          // this rank's stage of `whole` (0 without)
    int sync_sends;     // every send synchronous (MPI_Issend): nothing relies on MPI's buffers
    int one_by_one;     // every op its own call: no runs of ops as one region (batch.c)
} ExecOptions;

/* A tensor of the running plan, inside the arena. */
typedef struct {
    int32_t id;
    const char *name;       // "" when unnamed
    void *data;
    PlanDType dtype;
    PlanRole role;
    int rank;
    const int64_t *shape;
    int64_t numel;
} RtTensor;

#define RT_PHASE(ph) (1u << (ph))
#define RT_PHASES_ALL ((1u << PLAN_PHASE_COUNT) - 1)

/* Allocates one arena per memory space (program 0's space_bytes, once), resolves every op to its
 * CPU kernel, binds every call (a tensor with a rank_stride at offset + rank *
 * rank_stride), and initializes params (flat storages: this rank's part) and optimizer
 * state from o->seed; inputs start as zeros. NULL with a message ("plan uses op 'foo'
 * that this fsexec does not know; rebuild fsexec") on failure. p must outlive the Exec. */
Exec *rt_exec_new(const Plan *p, const ExecOptions *o, char *err, size_t errlen);
void rt_exec_free(Exec *e);
/* One step (1-based): writes the step input (PLAN_SR_STEP), then runs, in plan order, the ops whose
 * phase bit (RT_PHASE(PLAN_PHASE_FORWARD) | ...) is in `phases`. 0, or -1 for a step
 * out of range or an op the guard caught (rt_exec_error says which). Allocates nothing.
 * With world > 1 collectives run nonblocking over MPI, each waited for where the plan's
 * schedule says, all complete on return; every rank must make the same calls. */
int rt_exec_run(Exec *e, int64_t step, unsigned phases);
/* Writes the step input (PLAN_SR_STEP) and the step word of dropout's RNG words (PLAN_SR_RNG,
 * whose seed and rank words init wrote) for a step that runs elsewhere (a device). */
void rt_exec_set_step(Exec *e, int64_t step);
/* The same for ops [from, to) only (a step split around a point, e.g. to read the
 * gradients before the first optimizer op). In a pipeline every send and receive
 * started before `to` must be able to complete before the peer stage passes its own
 * split point (fsexec runs whole steps there). */
int rt_exec_run_ops(Exec *e, int64_t step, int32_t from, int32_t to, unsigned phases);
/* The runs that follow time each op they run into spans[op] (µs from the run's call;
 * a collective from its start to when it was seen complete), until spans is NULL. 0, or
 * -1 out of memory (the first time only: its one allocation). */
int rt_exec_time(Exec *e, RtSpan *spans);
/* The index of the first op of that phase; the op count if none. */
int32_t rt_exec_first_op(const Exec *e, PlanPhase phase);
/* The first tensor named `name`: 0, or -1 if none. */
int rt_exec_tensor(const Exec *e, const char *name, RtTensor *t);
void rt_exec_tensor_id(const Exec *e, int32_t id, RtTensor *t);
const Plan *rt_exec_plan(const Exec *e);
/* Why the last run returned -1 with ExecOptions.guard: the op, its source line and the
 * damaged bytes; "" otherwise. */
const char *rt_exec_error(const Exec *e);
int rt_exec_rank(const Exec *e);   // the data-parallel index
int rt_exec_world(const Exec *e);  // the data-parallel ranks of the stage
/* The plan of every stage (ExecOptions.whole; the Exec's own plan when it has one stage),
 * this rank's stage of it, and the stages. */
const Plan *rt_exec_whole(const Exec *e);
int rt_exec_stage(const Exec *e);
int rt_exec_stages(const Exec *e);
/* Where tensor id lives on this rank (offset + rank * rank_stride); NULL for a tensor a
 * host mirror does not hold. */
void *rt_exec_data(const Exec *e, int32_t id);
/* runtime/init.c: the 16-bit params each adamw_cast and sgd_cast writes (cast_in_update), made from the
 * master it updates (this rank's part of both), as its kernel makes them after a step:
 * after init and after a load of weights or a checkpoint. */
void rt_exec_cast_params(Exec *e);
int64_t rt_exec_arena_bytes(const Exec *e);  // the device space's
int64_t rt_exec_space_bytes(const Exec *e, PlanPlace s);
/* Bytes of space s held from its start (the planned size, or a mirror's prefix), and all
 * the host memory the Exec holds for tensors (a mirror: both prefixes and the outputs). */
int64_t rt_exec_held_bytes(const Exec *e, PlanPlace s);
int64_t rt_exec_host_bytes(const Exec *e);
/* Bytes of the kernels' workspace (f32 room for 16-bit calls), outside the arena; 0 if none. */
int64_t rt_exec_work_bytes(const Exec *e);
/* Offload on a device: in the device's host mirror, runs op k of the host space
 * (plan_op_on_host), once the device has done everything before it. 0, or -1 for an op
 * that is not one (rt_exec_error says why). */
int rt_exec_run_host_op(Exec *e, int32_t k);
/* The bytes the copies between the memory spaces (offload's to_host, to_device) moved
 * since the Exec was made: counted as they run, to check against the plan's. */
void rt_exec_copied(const Exec *e, int64_t *to_host, int64_t *to_device);
const void *rt_exec_arena(const Exec *e);  // the device space's
const void *rt_exec_space(const Exec *e, PlanPlace s);
/* Threads for OpenMP loops (n < 1: the default, every core); OpenBLAS always gets one, the
 * matmul kernel splitting large GEMMs over the OpenMP threads (one pool, cpu/matmul.c). */
void rt_set_threads(int n);
int rt_threads(void);

/* ---- runtime/guard.c: the debug guard ---------------------------------------------- */

/* Before op k every free byte of the arena (at k) gets a canary and every live buffer
 * the op may not write a checksum; after it, both must hold. See guard.c. */
typedef struct Guard Guard;
Guard *rt_guard_new(const Plan *p, PlanPlace space, uint8_t *arena, int64_t arena_bytes, char *err, size_t errlen);
void rt_guard_free(Guard *g);
void rt_guard_before(Guard *g, int32_t k);
/* 0, or -1 with the op, its source location and the damaged arena bytes in err. */
int rt_guard_after(Guard *g, int32_t k, char *err, size_t errlen);

/* ---- runtime/data.c: batches for the inputs ------------------------------------------ */

/* RT_DATA_ARRAYS: inputs of neither kind, fed from .npy files (a regressor's). */
typedef enum { RT_DATA_NONE, RT_DATA_LM, RT_DATA_CLASSES, RT_DATA_ARRAYS } RtDataKind;
typedef enum { RT_ORDER_RANDOM, RT_ORDER_SEQUENTIAL } RtDataOrder;
typedef enum { RT_TOKENS_AUTO, RT_TOKENS_LLMC, RT_TOKENS_RAW } RtTokenFormat;  // AUTO: asked for, never found

#define RT_DATA_KEY 0xDA7Au  // xored into the seed for batch randomness

typedef struct {
    const uint16_t *tok;
    int64_t n;
    RtTokenFormat format;
} RtTokens;

typedef struct RtData RtData;

/* A token file in memory, as `format` says: llm.c's (256 int32 header: magic 20240520,
 * version 1, count; then uint16 tokens), raw uint16 (any even size), or AUTO: llm.c's
 * when the magic is exact, else raw uint16 unless the file is something else: a .npy
 * file, a text, a damaged llm.c header (a magic a few bits off, a count that fits the
 * size, the zeroed tail of llm.c's header), an odd size. Points into buf. 0, or -1 with
 * a message that says what the file is (and for llm.c files: bad version, count, size). */
int rt_tokens_parse_as(const void *buf, size_t len, RtTokenFormat format, RtTokens *out, char *err, size_t errlen);
int rt_tokens_parse(const void *buf, size_t len, RtTokens *out, char *err, size_t errlen);  // AUTO
/* 0 if every token is < vocab; else -1 naming the first one that is not: its index, its
 * byte offset in the file (t->format), its value, and the largest token. */
int rt_tokens_check(const RtTokens *t, int64_t vocab, char *err, size_t errlen);
/* Where window b of a step starts (see data.c); n_tok >= T + 2. */
int64_t rt_lm_window_start(RtDataOrder order, uint64_t seed, int64_t step, int64_t B, int64_t b, int64_t T,
                           int64_t n_tok);
/* B windows of T + 1 tokens: tokens [B, T] and targets [B, T] (the same, one later). */
void rt_lm_batch(const RtTokens *t, RtDataOrder order, uint64_t seed, int64_t step, int64_t B, int64_t T,
                 int32_t *tokens, int32_t *targets);
/* Rows [row0, row0 + rows) of a global batch of B_global windows (a rank's slice). */
void rt_lm_rows(const RtTokens *t, RtDataOrder order, uint64_t seed, int64_t step, int64_t B_global, int64_t row0,
                int64_t rows, int64_t T, int32_t *tokens, int32_t *targets);
/* Class centers [K, D] ~ N(0, 1), fixed by the seed. K: the last dim of the logits (see
 * rt_plan_logits; else of the labels' cross-entropy input; else 2). */
void rt_blob_centers(uint64_t seed, int64_t K, int64_t D, float *centers);
/* Labels y [B] uniform in [0, K), features x [B, D] = centers[y] + 0.5 * N(0, 1). */
void rt_blobs_batch(const float *centers, uint64_t seed, int64_t step, int64_t B, int64_t D, int64_t K, float *x,
                    int32_t *y);
/* Rows [row0, row0 + rows) of the global batch (row b of every batch is keyed by b). */
void rt_blobs_rows(const float *centers, uint64_t seed, int64_t step, int64_t row0, int64_t rows, int64_t D,
                   int64_t K, float *x, int32_t *y);
/* The data inputs (every input without a step role), in tensor order (a model's is its
 * declaration order); an input of a later stage named as an earlier one's counts once.
 * Their count; the first `max` of them in ids. */
int rt_data_input_list(const Plan *p, int32_t *ids, int max);
/* The two data inputs of a model of exactly two: tokens and targets, or features and
 * labels. 0, or -1 when the plan has not exactly two. */
int rt_data_inputs(const Plan *p, int32_t *a, int32_t *b);
/* The tensor of p (one stage's program of `whole`, or whole itself) that is whole's data
 * input w (by name); PLAN_NONE when that stage does not read it. */
int32_t rt_stage_input(const Plan *whole, int32_t w, const Plan *p);
/* The tensors of p, one stage's program of `whole` (or whole itself), that are whole's
 * data inputs (rt_data_inputs): the same names; PLAN_NONE where the stage reads none. */
void rt_stage_inputs(const Plan *whole, const Plan *p, int32_t *a, int32_t *b);
/* Which kind of data a plan's inputs take (RT_DATA_NONE: neither). */
RtDataKind rt_data_kind(const Plan *p);
/* A classifier's logits [B, K]: the output named "logits", else the input of the
 * cross-entropy that the labels feed when it is an output; PLAN_NONE if neither. */
int32_t rt_plan_logits(const Plan *p);
/* The same for the labels tensor `labels` of p (PLAN_NONE: the output "logits" only). */
int32_t rt_plan_logits_for(const Plan *p, int32_t labels);
/* A classifier's classes K: the last dim of its logits (rt_plan_logits; else of the
 * labels' cross-entropy input); 2 when neither is there. */
int64_t rt_plan_classes(const Plan *p);
/* The vocab tokens must stay below: meta "vocab", else the rows of the embedding table
 * the tokens index and the classes of the cross-entropy the targets feed, else 65536. */
int64_t rt_plan_vocab(const Plan *p);
/* What op k of p indexes with (the one list of such reads; kernels stop on a value out of
 * range): an embedding's (and its backward's) indices, rows of its table; a
 * cross-entropy's (and its backward's) targets, classes of its logits. The index tensor
 * in *idx, the bound its values must stay below in *bound; RT_INDEX_NONE for other ops. */
/* Of logits or a table with `cols` classes (rows), how many are the model's: the loss's
 * `valid` where passes/pad_vocab.c padded a vocabulary (else a padded param's own rows,
 * for a program without the loss), or cols. */
int64_t rt_plan_valid_columns(const Plan *p, int64_t cols);
/* Of tensor t's last dim, the columns that are the model's: the `valid` of the loss that
 * reads t as its logits, else all of them. */
int64_t rt_logits_valid(const Plan *p, int32_t t);
typedef enum { RT_INDEX_NONE, RT_INDEX_ROWS, RT_INDEX_CLASSES } RtIndexKind;
RtIndexKind rt_op_index(const Plan *p, int32_t k, int32_t *idx, int64_t *bound);
/* Whether index read k (rt_op_index) also takes one value outside [0, bound), which it
 * skips (cross_entropy's ignore_index: the op's int attribute "ignore_index"): 1 and the
 * value, or 0. The one place that says which values besides the range an index read
 * allows; data.c's file checks and opcheck_mem.c's proof both ask it. */
int rt_op_index_sentinel(const Plan *p, int32_t k, int64_t *value);
/* Whether op `op` (by name) passes its inputs' values on unchanged (views, layout ops,
 * expand, all_gather): what the data that reaches an index has gone through. */
int rt_op_copies_values(const char *op);
/* The bound data input `input` of p (any stage's tensor of that name) must stay below:
 * the least bound of the index reads (rt_op_index) its values reach through ops that
 * copy them; the op with that bound in *by. 0 when no op indexes with it; -1 out of memory. */
int64_t rt_input_bound(const Plan *p, int32_t input, int32_t *by);
/* Whether every index read input's values reach allows the same value outside [0, bound)
 * (rt_op_index_sentinel): 1 and that value, else 0. */
int rt_input_sentinel(const Plan *p, int32_t input, int64_t *value);
/* Whether every index read of input ignores one value (a loss's ignore_index, inside the
 * range or not): 1 and that value, else 0. What the accuracy skips. */
int rt_input_ignored(const Plan *p, int32_t input, int64_t *value);
/* Whether input's values reach attention_masked's key masks and nothing else (through ops that
 * copy them, and casts): an additive mask, whose -inf masks a key, so the loader lets -inf pass. */
int rt_input_masks_only(const Plan *p, int32_t input);
/* The data source for e's plan: the token file `path`, read as `format` says (see
 * rt_tokens_parse_as; NULL: the built-in corpus) for a language model, Gaussian blobs
 * for a classifier (path must be NULL). Checks every token against the vocab. The
 * plan's inputs hold one rank's B rows: rank r of a world of N gets rows [r * B,
 * (r + 1) * B) of the global batch of N * B rows, the same rows a world-1 run of the
 * global batch makes. A pipeline's kind of data, vocab and classes are its whole plan's
 * (rt_exec_whole), and a stage fills only the data inputs it reads (none: nothing).
 * NULL with a message on failure. */
RtData *rt_data_open_as(Exec *e, const char *path, RtTokenFormat format, RtDataOrder order, uint64_t seed, char *err,
                        size_t errlen);
RtData *rt_data_open(Exec *e, const char *path, RtDataOrder order, uint64_t seed, char *err, size_t errlen);  // AUTO
/* rt_data_open_as; with .npy files, input k (rt_data_input_list's order) may have none
 * where optional[k] (it keeps its zeros: --predict's labels); optional may be NULL. */
RtData *rt_data_open_for(Exec *e, const char *path, RtTokenFormat format, RtDataOrder order, uint64_t seed,
                         const uint8_t *optional, char *err, size_t errlen);
/* A source that feeds nothing (its inputs stay zeros), for a run of no steps. */
RtData *rt_data_idle(char *err, size_t errlen);
/* Writes step's batch into the plan's inputs. Allocates nothing. */
void rt_data_fill(RtData *d, int64_t step);
RtDataKind rt_data_get_kind(const RtData *d);
const char *rt_data_describe(const RtData *d);  // for the start line
int64_t rt_data_items(const RtData *d);         // tokens (LM) or samples per step, all ranks
int64_t rt_data_rows(const RtData *d);          // samples per step, all ranks (the global batch)
int64_t rt_data_samples(const RtData *d);       // .npy files' samples (first dim); 0 for other data
/* A classifier's labels and logits on this stage (PLAN_NONE where it has none, and for
 * language models): what the accuracy is computed from. */
int32_t rt_data_labels(const RtData *d);
int32_t rt_data_logits(const RtData *d);
int64_t rt_data_ignore(const RtData *d);  // the labels' ignore_index (accuracy skips those rows), else OPS_NO_IGNORE
void rt_data_close(RtData *d);

/* ---- runtime/arrays.c: the data inputs from .npy files (--data NAME=FILE.npy,...) ------ */

typedef struct RtArrays RtArrays;
/* Whether `spec` gives p's data inputs .npy files: "NAME=FILE.npy,..." (not a file of that
 * name), or a directory of NAME.npy files. */
int rt_data_names_inputs(const Plan *p, const char *spec);
/* Every data input of e's whole plan from its file in spec, read and checked (see
 * arrays.c: each error names the input and the file); input k may lack one where
 * optional[k] (optional may be NULL). What was read into describe. NULL with a message. */
RtArrays *rt_arrays_open(Exec *e, const char *spec, const uint8_t *optional, char *describe, size_t dlen, char *err,
                         size_t errlen);
int64_t rt_arrays_samples(const RtArrays *a);  // the files' samples (first dim)
/* Rows [row0, row0 + rows) of step's global batch of B_global samples into this stage's
 * inputs. Allocates nothing. */
void rt_arrays_fill(RtArrays *a, RtDataOrder order, uint64_t seed, int64_t step, int64_t B_global, int64_t row0,
                    int64_t rows);
void rt_arrays_free(RtArrays *a);
/* Sample b of step s (1-based) of a global batch of B, of n (see arrays.c). */
int64_t rt_data_sample(RtDataOrder order, uint64_t seed, int64_t step, int64_t B, int64_t b, int64_t n);

/* ---- runtime/npy.c: NumPy .npy arrays (--data NAME=FILE.npy) -------------------------- */

typedef struct {
    PlanDType dtype;               // PLAN_DT_F32 (from float32/float64) or PLAN_DT_I32 (int32/int64)
    int rank;
    int64_t shape[PLAN_MAX_RANK];  // the file's shape; shape[0]: the samples
    int64_t numel;
    char descr[16];                // the file's dtype ("<f8"), for messages
    void *data;                    // numel elements of dtype (plan_alloc)
} RtArray;

/* A .npy file (format 1.0, 2.0 or 3.0) in memory as an RtArray (its data copied and
 * converted). 0, or -1 with a message that says what the file holds and how to convert
 * it: big-endian or other dtypes, Fortran order, a float64 outside float32's range, an
 * int64 outside int32's, a header that does not parse, a size that does not match. */
int rt_npy_parse(const void *buf, size_t len, RtArray *a, char *err, size_t errlen);
/* The same for the file at path (messages start with it). */
int rt_npy_read(const char *path, RtArray *a, char *err, size_t errlen);
void rt_npy_free(RtArray *a);
/* "(100, 16)", "(5,)", "()": a shape as NumPy prints it. */
const char *rt_npy_shape_str(int rank, const int64_t *shape, char *buf, size_t n);

/* ---- runtime/state.c: one rank's training state as pieces of named tensors ---------- */

/* What a logical tensor of the state is: a param, a param's optimizer state, or the
 * step's own state (the optimizer's step counter, the fp16 loss scale). */
typedef enum { RT_STATE_PARAM, RT_STATE_OPTIM, RT_STATE_OTHER, RT_STATE_COUNT } RtStateKind;

/* Elements [first, first + count) (row-major) of the logical tensor `name` (see state.c:
 * "h.0.attn.w", "h.0.attn.w.exp_avg", "opt_step"; the same in every plan of the model),
 * at `data` on this rank, in plan tensor `holder`. */
typedef struct {
    const char *name;
    RtStateKind kind;
    PlanDType dtype;
    int rank;
    const int64_t *shape;   // the logical tensor's
    int64_t first, count;
    void *data;             // NULL without an Exec (rt_state_of_plan, rt_state_at, a checkpoint's)
    int32_t holder;
    int own;                // this rank writes it: over the world each element is owned once
} RtPiece;

typedef struct RtState RtState;
/* Every piece of state e's rank holds, in tensor order; NULL with a message. */
RtState *rt_state_new(const Exec *e, char *err, size_t errlen);
/* The pieces of a plan of one program at rank 0 of 1 (every logical tensor it holds,
 * whole), without data: what the plan's state is named. */
RtState *rt_state_of_plan(const Plan *p, char *err, size_t errlen);
/* The pieces data-parallel rank `rank` of `dp` holds of p, a plan of one program (a
 * stage: as its first stage, owning what it holds), without data. */
RtState *rt_state_at(const Plan *p, int rank, int dp, char *err, size_t errlen);
void rt_state_free(RtState *s);
int32_t rt_state_count(const RtState *s);
const RtPiece *rt_state_piece(const RtState *s, int32_t i);
/* The root tensors the pieces lie in (a load zeroes them first: their padding). */
int32_t rt_state_holders(const RtState *s, const int32_t **ids);
const char *rt_state_kind_name(RtStateKind k);  // "param", "optimizer", "state"
/* Elements [first, first + count) of the logical tensor `name` of kind k, at data, in
 * the domain of its values in a checkpoint of `step` steps: params and optimizer state
 * f32 and finite, second moments (".exp_avg_sq") >= 0, "opt_step" and
 * "loss_scale.good_steps" i32 from 0 to step, "loss_scale" f32, finite and > 0. 0, or
 * -1 with a message naming the tensor, the element and its value. */
int rt_state_check(const char *name, RtStateKind k, PlanDType dtype, const void *data, int64_t first, int64_t count,
                   int64_t step, char *err, size_t errlen);

/* ---- runtime/checkpoint.c: checkpoints on disk --------------------------------------- */

typedef struct {
    const char *dir;     // --checkpoint-dir: DIR/step-NNNNNNNN/ per checkpoint
    int keep;            // the newest `keep` complete checkpoints stay (0: all of them)
    uint64_t seed;       // the run's seed (init, data order), recorded in the manifest
    const char *data;    // rt_data_describe, recorded
    const char *data_path;  // --data as given (NULL: the built-in data): its files recorded (record.c)
    RtDataOrder order;
    int64_t bytes;       // a checkpoint's size (rt_checkpoint_size): checked free before each save; 0: not
} RtCheckpointOptions;

typedef struct {
    char path[4096];     // DIR/step-NNNNNNNN
    int64_t bytes;       // every rank's file together
    int files;
    double seconds;      // from the first rank file to the manifest (and the pruning)
} RtSaved;

/* The whole training state after `step` steps: every world rank writes the pieces it
 * owns (rt_state_new), then rank 0 the manifest (see checkpoint.c); then the checkpoints
 * beyond the newest o->keep go. Every rank calls it, with the state on the host (a
 * device downloads it first); the result is agreed (a message on the rank that failed,
 * an empty err elsewhere). */
int rt_checkpoint_save(const Exec *e, int64_t step, const RtCheckpointOptions *o, RtSaved *out, char *err,
                       size_t errlen);
/* A hash of a plan read from a file (its sections' CRCs): the same plan, the same hash. */
uint64_t rt_plan_hash(const Plan *p);
/* runtime/ckdir.c: the bytes a checkpoint of this plan takes on disk (every logical
 * tensor once, with a generous bound on the headers), or -1 with a message. */
int64_t rt_checkpoint_size(const Plan *whole, char *err, size_t errlen);
/* Before a run that saves into dir: every step directory in it is a directory (not a
 * link), every manifest, rank file and temporary file in those is a regular file, and
 * its file system (its parent's, when dir is still to be made) has `bytes` free. 0, or
 * -1 with a message naming the path and what it is, or the bytes needed and free. */
int rt_checkpoint_check_dir(const char *dir, int64_t bytes, char *err, size_t errlen);

typedef struct RtCheckpoint RtCheckpoint;
/* Opens the checkpoint at path (a step directory with its manifest) or the newest
 * complete one in path, and checks everything but the data: the manifest, every file it
 * names (size, header CRC, that it is of this checkpoint), every piece's metadata against
 * the tensor the file holds, and that the pieces of every logical tensor tile it. NULL
 * with a message naming the file and what is wrong. */
RtCheckpoint *rt_checkpoint_open(const char *path, char *err, size_t errlen);
void rt_checkpoint_close(RtCheckpoint *c);
/* The name of the checkpoint's file (its manifest, or a rank file) that path is (the
 * same file, through any link or name), or NULL: an output must not be one. */
const char *rt_checkpoint_holds(const RtCheckpoint *c, const char *path);
const char *rt_checkpoint_dir(const RtCheckpoint *c);  // its step directory
int64_t rt_checkpoint_step(const RtCheckpoint *c);     // the steps done when it was saved
uint64_t rt_checkpoint_seed(const RtCheckpoint *c);
/* What the manifest says of the plan that saved it ("hash", "shard", "precision",
 * "offload", "model") and of its data ("source", "order"), or NULL; and its numbers
 * ("world", "stages", "dp", "microbatches"). */
const char *rt_checkpoint_info(const RtCheckpoint *c, const char *key);
int64_t rt_checkpoint_info_int(const RtCheckpoint *c, const char *key, int64_t def);

/* The pieces of the checkpoint, by (name, first element), as RtPieces without data or
 * holder; the first piece of `name`, or -1. */
int32_t rt_checkpoint_count(const RtCheckpoint *c);
void rt_checkpoint_piece(const RtCheckpoint *c, int32_t i, RtPiece *out);
int32_t rt_checkpoint_find(const RtCheckpoint *c, const char *name);
/* Piece i's bytes into buf (bytes long), its CRC-32 checked, then its values against
 * their domain (rt_state_check): 0, or -1 naming the file, the tensor and its byte
 * range, or the element and its value. */
int rt_checkpoint_read(const RtCheckpoint *c, int32_t i, void *buf, char *err, size_t errlen);
/* How a weights file names and lays out the params: ours (RT_WEIGHTS_FSEXEC: the .fsm's
 * names, matmul weights [in, out]), or a Hugging Face model's by a table of names
 * (runtime/hfmap.c: the built-in hf-gpt2, hf-llama, hf-bert, or a user's map:FILE.json). */
typedef struct RtHfMap RtHfMap;
typedef const RtHfMap *RtWeightsFormat;
#define RT_WEIGHTS_FSEXEC ((RtWeightsFormat)0)
/* fsexec --export: every param, consolidated, as one safetensors file at out (what
 * --save-weights writes): written in order through one fixed buffer (its bytes in
 * *buffer), every piece's CRC checked, atomically. In a Hugging Face format f
 * (rt_hf_write: its names, layouts, tied copies left out) every param is held in memory
 * (*buffer: their bytes), as the layout transposes whole tensors. 0, or -1 with a message. */
int rt_checkpoint_export(const RtCheckpoint *c, const char *out, RtWeightsFormat f, int64_t *buffer, char *err,
                         size_t errlen);

/* ---- runtime/resume.c: a checkpoint into a plan of the same model -------------------- */

typedef struct {
    int64_t elements[RT_STATE_COUNT];  // loaded over the world, by kind
    int files;
    int same_plan;                     // the plan that saved it (then the run goes on bit for bit)
    char unused[512];                  // tensors of the checkpoint this plan has not ("loss_scale, ...")
    char kept[512];                    // this plan's step state the checkpoint lacks, left at its start
} RtResumed;

/* Fills e's state (every rank's: its own pieces, whatever plan saved it) from c: each
 * logical tensor's elements that e's rank holds from the checkpoint's pieces, every one
 * read once with its CRC checked, the holders' padding zeroed. A tensor of this plan the
 * checkpoint lacks, or of another shape or dtype, is an error naming it (but step state
 * such as an fp16 loss scale after an fp32 run, which starts where the plan starts it).
 * Every rank calls it; the result is agreed; on an error the state is not usable (the
 * run must not start). */
int rt_checkpoint_load(const RtCheckpoint *c, Exec *e, RtResumed *r, char *err, size_t errlen);
/* The same, but with partial (--resume-partial) a tensor the checkpoint lacks or holds in
 * another shape is no error: it stays as the plan started it (initialized), named in
 * r->kept; what the checkpoint has beyond the plan is named in r->unused. */
int rt_checkpoint_load_as(const RtCheckpoint *c, Exec *e, int partial, RtResumed *r, char *err, size_t errlen);
/* "resumed ck/step-00000003 at step 3: ..." for the start: what was read and from which
 * topology to which. */
void rt_resumed_describe(const RtCheckpoint *c, const RtResumed *r, const Plan *whole, char *buf, size_t n);

/* ---- runtime/signals.c: SIGINT and SIGTERM in a training run ----------------------- */

enum { RT_SIGNAL_RELAYED = 0x100 };  // in a stop flag: relayed by fsexec --nproc's launcher
/* Installs the handlers (who: "fsexec", "[rank 1] fsexec"; rank: the world rank); the flag
 * a first signal sets (its number, | RT_SIGNAL_RELAYED when the launcher relayed it), for
 * RtTrainOptions.stop. */
volatile sig_atomic_t *rt_signals_catch(const char *who, int rank);
/* Of an agreed flag: the signal (SIGINT, SIGTERM), and whether the launcher relayed it
 * (then the ranks exit 0 and the launcher reports the signal). */
int rt_signal_of(int agreed);
int rt_signal_relayed(int agreed);
/* A checkpoint of `step` is being written into the step directory path (NULL: no longer):
 * a second signal meanwhile abandons it. */
void rt_signals_saving(const char *path, int64_t step);

/* ---- runtime/launch.c: fsexec --nproc's launcher ------------------------------------ */

/* Runs argv (mpirun ..., from rt_launch_argv) as a child in a process group of its own,
 * with FSEXEC_LAUNCHER set to this process; relays SIGINT and SIGTERM to it as SIGUSR1
 * and SIGUSR2 (saying so once); waits. Its exit status: mpirun's, or 128 + the signal when
 * one was relayed and the ranks stopped for it (mpirun exits 0); -1 with err when it
 * cannot be started. */
int rt_launch_run(const char *const *argv, char *err, size_t errlen);

/* ---- runtime/record.c: what a resume compares with the checkpoint's record ----------- */

/* The model: 0 when whole is a plan of the checkpoint's model (its dims, but the batch
 * dim, and every param's name and shape; any world, strategy, precision or stages); 1
 * with what differs in msg (dims, params missing, extra and reshaped); -1 with an error. */
int rt_resume_check_model(const RtCheckpoint *c, const Plan *whole, char *msg, size_t n);
/* The data: 0 when this run reads what the checkpoint's read (or other_ok); 1 with a
 * warning in msg when a file differs (kind, size, first MiB); -1 with an error in msg when
 * the checkpoint's run read files and this one has no --data (data NULL). */
int rt_resume_check_data(const RtCheckpoint *c, const char *data, int other_ok, char *msg, size_t n);

/* ---- runtime/safetensors.c: weights and gradients as safetensors ---------------------- */

typedef struct {
    const char *name;
    PlanDType dtype;
    int rank;
    const int64_t *shape;
    void *data;
} StEntry;

/* Writes the tensors (header: their names, dtypes, shapes, offsets; __metadata__ format
 * "pt" and the step) atomically. 0, or -1 with a message naming the path. */
int rt_st_write(const char *path, const StEntry *t, int32_t n, int64_t step, char *err, size_t errlen);
/* The same with __metadata__ format "pt" and then n_meta pairs (meta[2i]: key, meta[2i+1]:
 * value). */
int rt_st_write_meta(const char *path, const StEntry *t, int32_t n, const char *const *meta, int n_meta, char *err,
                     size_t errlen);
/* The header bytes alone (the u64 length, the JSON padded to 8), for a writer that
 * streams the data after it in order; free *out with plan_dealloc. 0, or -1 when out of
 * memory (or a name that is not UTF-8). */
int rt_st_header(const StEntry *t, int32_t n, const char *const *meta, int n_meta, uint8_t **out, size_t *len);

/* "F32 [64, 192]" (PLAN_DT_COUNT: "[64, 192]"), for messages. */
const char *rt_st_shape_str(PlanDType dt, int rank, const int64_t *shape, char *buf, size_t n);
/* A safetensors file opened for reading pieces of it: the header checked whole (as
 * rt_st_read does: every field, the offsets tiling the data exactly), the data left on
 * disk. Tensors are listed by data offset; begin and end are byte offsets in the file. */
typedef struct {
    const char *name;
    PlanDType dtype;
    int rank;
    int64_t shape[PLAN_MAX_RANK];
    uint64_t begin, end;
} StTensor;
typedef struct StFile StFile;
StFile *rt_st_open(const char *path, char *err, size_t errlen);  // NULL with a message (without the path)
/* The same of a file open at fd (size bytes), which the StFile then owns (closed on failure too). */
StFile *rt_st_open_fd(int fd, int64_t size, char *err, size_t errlen);
/* The first of n floats of dtype dt (F32, F16, BF16) at p that is NaN or Inf, or -1. */
int64_t rt_st_first_nonfinite(const uint8_t *p, int64_t n, PlanDType dt);
void rt_st_close(StFile *f);
size_t rt_st_count(const StFile *f);
const StTensor *rt_st_tensor(const StFile *f, size_t i);
uint64_t rt_st_size(const StFile *f);        // bytes of the file
uint32_t rt_st_header_crc(const StFile *f);  // CRC-32 of the header bytes (length and JSON)
const char *rt_st_meta(const StFile *f, const char *key);  // a __metadata__ value, or NULL
/* len bytes at file offset at into buf; 0, or -1 (past the end, or a read error). */
int rt_st_pread(const StFile *f, void *buf, uint64_t len, uint64_t at);
/* The whole file mapped read-only (a tensor's bytes at map + begin), or NULL with a
 * message; rt_st_unmap(f, NULL) does nothing. */
const uint8_t *rt_st_map(const StFile *f, char *err, size_t errlen);
void rt_st_unmap(const StFile *f, const uint8_t *map);
/* 0 when tensor t (its bytes at data) holds only finite floats (I32: always); else -1
 * naming the tensor and its first NaN or Inf, as rt_st_read does. */
int rt_st_check_finite(const StTensor *t, const uint8_t *data, char *err, size_t errlen);
/* Fills each t[i].data from the file after checking the whole file: every header field,
 * the offsets, that the file holds exactly these names with these dtypes and shapes, and
 * that every F32, F16 and BF16 value is finite (else the message names the tensor and the
 * first bad element). On any error nothing is written and -1 comes back with a message. */
int rt_st_read(const char *path, const StEntry *t, int32_t n, char *err, size_t errlen);
/* The same, where the file may also hold the n_also tensors named in `also` (params of
 * other stages), which are not read. */
int rt_st_read_part(const char *path, const StEntry *t, int32_t n, const char *const *also, int32_t n_also,
                    char *err, size_t errlen);

/* ---- runtime/hfmap.c: the tables of Hugging Face names -------------------------------- */

/* RtWeightsFormat: with runtime/checkpoint.c's declarations, which --export takes. */

/* "fsexec" (RT_WEIGHTS_FSEXEC), a built-in table ("hf-gpt2", "hf-llama", "hf-bert"), or
 * "map:FILE.json", read and checked (see hfmap.c): 0 and *out (free it with
 * rt_weights_format_free); -1 with a message for a bad table; 1 with a message for a
 * name that is none of these (a usage error). */
int rt_weights_format_parse(const char *s, RtWeightsFormat *out, char *err, size_t errlen);
void rt_weights_format_free(RtWeightsFormat f);
const char *rt_weights_format_name(RtWeightsFormat f);  // "fsexec", "hf-gpt2", "map:FILE.json"
/* A table from its JSON text, named `name` in messages ("map:FILE.json" when user: then
 * every row but the optional must name a param of the model it loads into). NULL with a
 * message naming the row. */
RtHfMap *rt_hf_map_parse(const char *text, size_t len, const char *name, int user, char *err, size_t errlen);
void rt_hf_map_free(RtHfMap *m);
/* The built-in tables, runtime/hf/NAME.json embedded by cmake/embed_maps.cmake. */
typedef struct {
    const char *name;  // "hf-gpt2"
    const char *json;
} RtHfBuiltin;
extern const RtHfBuiltin rt_hf_builtin[];
extern const int rt_hf_n_builtin;

/* ---- runtime/hf.c: Hugging Face names and layouts of the params --------------------- */

/* The name format f stores our param `ours` under ("h.3.attn.w" -> hf-gpt2's
 * "transformer.h.3.attn.c_attn.weight"), into buf; NULL when the mapping has no row for it. */
const char *rt_hf_name(RtWeightsFormat f, const char *ours, char *buf, size_t n);
/* HF's name hf without the format's prefix ("transformer.", "model."), as a base model's
 * files have it; NULL when hf has none. */
const char *rt_hf_unprefixed(RtWeightsFormat f, const char *hf);
/* As rt_st_read_part, from a file in format f (not RT_WEIGHTS_FSEXEC): each t[i] (our
 * name, shape, f32 data) from its HF tensor, upcast from F16/BF16 exactly and transposed
 * where the layouts differ; HF's buffers (GPT-2's attn.bias, attn.masked_bias; Llama's
 * rotary inv_freq) are skipped, a tied copy (GPT-2's lm_head.weight) must equal its
 * source, and every other tensor of the file must map to a t[i] or to a name in `also`.
 * Every check (names, shapes, finite values) before the first byte is written. 0, or -1
 * with a message naming the path. */
int rt_hf_read(const char *path, RtWeightsFormat f, const StEntry *t, int32_t n, const char *const *also,
               int32_t n_also, char *err, size_t errlen);
/* The tensors t (our names, shapes, f32 data) as format f's safetensors file, F32,
 * transposed where the layouts differ, written atomically through a fixed buffer; tied
 * copies and buffers are not written. 0, or -1 with a message naming the path. */
int rt_hf_write(const char *path, RtWeightsFormat f, const StEntry *t, int32_t n, int64_t step, char *err,
                size_t errlen);

/* ---- runtime/weights.c: the model's params and gradients in and out ------------------ */

/* Every param (tied ones once), under its name. With world > 1 every rank calls it:
 * each unit's authoritative flat ranges (rt_flat_owned) are gathered to rank 0, which
 * writes the consolidated params; the result (0 or -1) is the same on every rank, the
 * message only on rank 0 (other ranks: an empty err). A pipeline (rt_exec_stages > 1):
 * the first rank of each stage writes its stage's params to rt_weights_shard_path, and
 * world rank 0 then writes PATH.index.json (Hugging Face's sharded checkpoint: metadata
 * total_size, and a weight_map from every name to the first stage's file holding it; a
 * param two stages hold, as a tied embedding, is in both files). */
int rt_save_weights(const Exec *e, const char *path, int64_t step, char *err, size_t errlen);
/* Stage `stage` of `stages`'s file for weights saved to path: "out.safetensors" ->
 * "out-00001-of-00002.safetensors" (Hugging Face's names; a path not ending in
 * .safetensors gets the suffix after it); path itself for one stage. */
const char *rt_weights_shard_path(const char *path, int stage, int stages, char *buf, size_t n);
/* Every param's gradient ("<param>.grad"), under the param's name (fp16's unscaled, as
 * f32); call after the ops before rt_save_grads_point. World 1 only. */
int rt_save_grads(const Exec *e, const char *path, int64_t step, char *err, size_t errlen);
/* The op before which every gradient of the step is made and still held (the first
 * optimizer op that reads one), or -1 with the reason in err: a plan whose updates start before its
 * backward ends (--offload's), or one that frees a gradient's buffer before it. */
int32_t rt_save_grads_point(const Exec *e, char *err, size_t errlen);
/* Every rank reads the whole file and keeps what its storages hold; the result is
 * agreed over the ranks (an empty err on a rank that did not fail itself). A stage of a
 * pipeline takes the params it has: the file may hold other stages' too, nothing else.
 * A sharded index (PATH.index.json, as a pipeline saves and Hugging Face writes; or PATH
 * when only PATH.index.json exists) is read shard by shard, each for what it holds. */
int rt_load_weights(Exec *e, const char *path, char *err, size_t errlen);
/* The same two in format fmt (runtime/hf.c); RT_WEIGHTS_FSEXEC is the two above. A
 * pipeline's index names the format's tensors. */
int rt_save_weights_as(const Exec *e, const char *path, int64_t step, RtWeightsFormat fmt, char *err, size_t errlen);
int rt_load_weights_as(Exec *e, const char *path, RtWeightsFormat fmt, char *err, size_t errlen);

/* ---- runtime/progress.c: per-step reporting ------------------------------------------ */

typedef struct Progress Progress;

typedef struct {
    int64_t steps;         // the run's length: its last step
    int64_t start;         // steps done before the first this run makes (a resumed run)
    int append;            // add to the log file (a resumed run) rather than start it again
    int log_every;         // plain lines every N steps (a terminal too, above its bar); <= 0: 1 up to 100 steps, else 10
    const char *log_path;  // JSON lines, one per step; NULL for none
    const char *unit;      // "tok" or "samples" (default "tok"); the log's tokens_per_s or samples_per_s
    int tty;               // -1: ask isatty(out); 0/1 force plain lines only / a bar under them
    FILE *out;             // NULL: stderr with a bar when stdout and stderr are terminals, else stdout
} ProgressOptions;

typedef struct {
    int64_t step;
    double loss, lr, grad_norm;
    double ms;             // this step's wall time
    double items;          // tokens (or samples) in this step
    double accuracy;       // NAN when the model has none
    int has_scale;         // fp16: the plan has a loss scale ...
    double loss_scale;     // ... its value after this step
    double scale_before;   // ... and the one the step started with
    int skipped;           // the optimizer skipped the step (fp16: the gradients overflowed)
    int64_t to_host_bytes, to_device_bytes;  // what this step copied between the spaces (offload)
    int evaluated;         // an evaluation ran after this step (rt_eval_run): ...
    double val_loss, val_accuracy;  // ... its loss and accuracy (NAN when the model has none)
} StepStats;

Progress *rt_progress_new(const ProgressOptions *o, char *err, size_t errlen);
/* Reports one step (NULL: nothing, as on ranks other than 0); -1 with a message if the
 * log cannot be written. */
int rt_progress_step(Progress *p, const StepStats *s, char *err, size_t errlen);
/* An evaluation before any step (step 0): a line and a log line of its own. */
int rt_progress_eval(Progress *p, int64_t step, double val_loss, double val_accuracy, char *err, size_t errlen);
/* A line of its own between the step lines (a checkpoint saved); nothing for NULL. */
void rt_progress_note(Progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Ends the bar, prints the average rate, closes the log. */
int rt_progress_end(Progress *p, char *err, size_t errlen);

/* What the bar's line shows. */
typedef struct {
    int64_t step, steps;
    double loss, accuracy;  // accuracy NAN when the model has none
    double per_s;           // items per second, of `unit` ("tok", "samples")
    double ms;              // this step's wall time
    double eta_s;           // seconds to the last step
    const char *unit;
} ProgressBar;
/* The bar's line for a terminal `cols` wide, in buf (NUL-terminated): at most cols - 1
 * characters, so it never wraps; fields are dropped as it narrows (ms/step, the rate,
 * the bar, accuracy, the ETA), step and loss always kept. Its length. */
int rt_progress_bar_fit(const ProgressBar *b, int cols, char *buf, size_t n);
/* mean(argmax(logits[b]) == y[b]) over B rows of K. */
double rt_accuracy(const float *logits, const int32_t *y, int64_t B, int64_t K);
/* The rows of B whose argmax is their label y, among the rows whose label is not
 * `ignore` (OPS_NO_IGNORE: none), which *counted receives. */
int64_t rt_correct(const float *logits, const int32_t *y, int64_t B, int64_t K, int64_t ignore, int64_t *counted);
/* The same over the first W of each row's K logits (a padded classifier's own classes:
 * rt_plan_valid_columns). */
int64_t rt_correct_of(const float *logits, const int32_t *y, int64_t B, int64_t K, int64_t W, int64_t ignore,
                      int64_t *counted);
/* Monotonic seconds. */
double rt_now(void);

/* ---- runtime/rank.c: which rank this is, from the launcher's environment ------------- */

typedef enum {
    RT_LAUNCH_NONE, RT_LAUNCH_OMPI, RT_LAUNCH_PMI, RT_LAUNCH_SLURM, RT_LAUNCH_PMIX, RT_LAUNCH_TORCHRUN, RT_LAUNCH_COUNT
} RtLaunch;

typedef struct {
    RtLaunch launch;              // who started this process
    int rank, world;              // world 0: the launcher does not say (PMIx): MPI tells
    int local_rank, local_world;  // on this node; -1 when unknown (MPI tells)
} RtRanks;

typedef const char *(*RtGetenv)(void *ctx, const char *name);

/* Rank and world from OMPI_COMM_WORLD_*, PMI_*, SLURM_* (inside a job step), PMIX_RANK
 * or RANK/WORLD_SIZE, in that order; none: rank 0 of 1. -1 with a message for values
 * that are not ranks, and for a torchrun-style world > 1 (MPI needs its launcher). */
int rt_ranks_discover(RtGetenv get, void *ctx, RtRanks *r, char *err, size_t errlen);
int rt_ranks_from_env(RtRanks *r, char *err, size_t errlen);
const char *rt_launch_name(RtLaunch l);
/* The argv of `fsexec --nproc N`: mpirun -np N --oversubscribe --bind-to none -x
 * OMP_NUM_THREADS [--allow-run-as-root] exe args..., NULL-terminated
 * in out (cap entries; np_buf holds N's digits). The count, or -1 if cap is too small. */
int rt_launch_argv(const char *mpirun, const char *exe, int nproc, int as_root, char *const *args, int n_args,
                   const char **out, int cap, char *np_buf, size_t np_len);

/* The ranks a plan runs on (plan.h: PlanProgram): world = stages x dp, the data-parallel
 * ranks of each stage; world rank r is stage r / dp at data-parallel index r % dp. */
#define RT_MAX_WORLD (1 << 20)
typedef struct {
    int stages, dp, world;
    int shard;  // the ranks a shard is split over, of the dp (plan_shard_group; dp without hybrid groups)
} RtLayout;
/* A plan without programs: one stage of meta "world". 0, or -1 with a message when the
 * programs disagree on dp_world or the world is too large. */
int rt_plan_layout(const Plan *p, RtLayout *l, char *err, size_t errlen);
/* "world 2", or "2 stages x 2 data-parallel ranks = world 4". */
const char *rt_layout_str(const RtLayout *l, char *buf, size_t n);

/* ---- runtime/comm.c: MPI between ranks ------------------------------------------------ */

/* Starts MPI when r->world != 1 (a world of one never touches MPI) and checks that it
 * sees the world the launcher announced; fills world (PMIx) and the local rank and
 * size from MPI. 0, or -1 with a message. */
int rt_comm_init(RtRanks *r, char *err, size_t errlen);
/* Splits the world for a plan of `stages` stages of `dp` ranks each (world = stages x dp,
 * rank r is stage r / dp at data-parallel index r % dp): the data-parallel ranks of each
 * stage (a collective's group 0, the gather and sum below), the ranks of each
 * data-parallel index, one per stage (group 1), and a copy of the world that only
 * point-to-point ops use; with hybrid sharding (1 < shard < dp, shard dividing dp) the
 * shard groups of `shard` consecutive data-parallel ranks (group 2) and the replica
 * groups of the dp / shard ranks at one index within them (group 3). Every rank calls it
 * once, after rt_comm_init; with one stage the world is group 0. 0, or -1 with a message. */
int rt_comm_layout(int stages, int dp, int shard, char *err, size_t errlen);
int rt_comm_rank(void);
int rt_comm_world(void);
/* How messages name this rank: "rank 3", or with several stages "rank 3, stage 1". */
const char *rt_comm_who(void);
void rt_comm_finalize(void);
/* Ends every rank (MPI_Abort when MPI is up), with exit status code. */
_Noreturn void rt_comm_abort(int code);
/* The first rank of this stage's data-parallel group (rank 0 with one stage) receives
 * every rank's n floats in rank order into recv (n * dp floats; ignored on other ranks).
 * Blocking, every rank of the group calls it. */
void rt_comm_gather_f32(const float *send, int64_t n, float *recv);
/* The largest rc over every rank of the world (every rank calls it): an error anywhere
 * is everyone's. */
int rt_comm_agree(int rc);
/* The same, with what the watchdog names when a rank does not reach it. */
int rt_comm_agree_on(int rc, const char *what);
/* Every world rank's n numbers, in world rank order, into all (n x world); every rank
 * calls it. */
void rt_comm_allgather_u64(const uint64_t *mine, int n, uint64_t *all);
/* Every world rank's n bytes, in rank order, into one block that rank 0 gets (malloc'ed,
 * sizes[r] the bytes of rank r; free() it); NULL on the other ranks, and on every rank when
 * it cannot be done (out of memory, over 2 GiB in all: agreed). Every rank calls it. */
void *rt_comm_gather_bytes(const void *mine, int64_t n, int64_t *sizes);
/* The sum over this stage's data-parallel ranks (every one of them calls it). */
int64_t rt_comm_sum_i64(int64_t v);

/* What an op moves between ranks, numbered as the op table's OpComm. */
typedef enum {
    RT_COLL_ALL_REDUCE, RT_COLL_REDUCE_SCATTER, RT_COLL_ALL_GATHER, RT_COLL_SEND, RT_COLL_RECV, RT_COLL_COUNT
} RtCollKind;

/* Bytes [lo, hi) of memory. */
typedef struct {
    uintptr_t lo, hi;
} RtRange;

/* One collective or point-to-point op of the plan, bound to this rank's buffers. */
typedef struct {
    RtCollKind kind;
    PlanDType dtype;
    void *in, *out;
    int64_t n;          // elements of one rank's block: all_reduce: all of x; reduce_scatter:
                        // out; all_gather: x; send, recv: the message
    int world;
    int avg;            // divide the sum by the world on completion
    int avg_over;       // ... by this many ranks instead, when > 0 (a replica group's: all D)
    int in_place;       // MPI_IN_PLACE
    int move_after;     // in-place reduce_scatter whose out is not x's start: move on completion
    RtRange range[2];   // the bytes of x and of out: nothing may touch them while in flight
    int slot;           // its persistent request in the queue (rt_comm_bind), or -1
    int group;          // a collective's ranks: OP_GROUP_DATA, _PIPE, _SHARD or _REPLICA
    int peer;           // send, recv: the world rank at the other end
    int sync;           // send: synchronous (MPI_Issend), complete only once received
    int tag;            // send, recv: the MPI tag (the op's `tag`; set after rt_p2p_prepare)
    const Plan *plan;   // the plan op it runs, for the watchdog's message; NULL and
    int32_t op;         // PLAN_NONE unless the executor says (rt_coll_prepare clears them)
    double *done_at;    // where completion writes rt_now() (a traced step), or NULL
} RtColl;

/* The kind of an op name (a collective, send or recv), or -1. */
int rt_coll_kind(const char *op);
/* Whether any nonempty range of a overlaps any of b: the hazard test. */
int rt_ranges_overlap(const RtRange *a, int na, const RtRange *b, int nb);
/* Binds a collective (x: n_in elements, out: n_out) on `rank` of `world` (of group 0;
 * set c->group after for another) and decides how it runs in place; -1 with a message
 * for sizes that do not fit the kind, dtypes MPI cannot reduce here, and overlaps of x
 * and out that MPI_IN_PLACE cannot express. */
int rt_coll_prepare(RtColl *c, RtCollKind kind, PlanDType dt, void *in, int64_t n_in, void *out, int64_t n_out,
                    int world, int rank, int avg, char *err, size_t errlen);
/* Binds a send (buf: what goes) or recv (buf: where it lands) of n elements to or from
 * world rank `peer`; -1 with a message for a count beyond MPI's int or a bad dtype. */
int rt_p2p_prepare(RtColl *c, RtCollKind kind, PlanDType dt, void *buf, int64_t n, int peer, int sync, char *err,
                   size_t errlen);

/* Collectives and point-to-point ops in flight, at most `capacity` (the plan's count). */
typedef struct RtCommQueue RtCommQueue;
RtCommQueue *rt_comm_queue_new(int capacity);
void rt_comm_queue_free(RtCommQueue *q);
int rt_comm_pending(const RtCommQueue *q);
/* Sets c up once as a persistent request: a send or recv always, a collective where MPI
 * has persistent ones (every rank of its group binds the same collectives in the same
 * order); c->slot stays -1 otherwise. */
void rt_comm_bind(RtCommQueue *q, RtColl *c);
void rt_comm_start(RtCommQueue *q, const RtColl *c);          // c must stay valid until it completes
void rt_comm_poll(RtCommQueue *q);                             // MPI_Test each: lets them progress
/* Waits for c when it is still in flight (the schedule's wait); nothing when it is done. */
void rt_comm_wait_for(RtCommQueue *q, const RtColl *c);
void rt_comm_wait_all(RtCommQueue *q);

/* ---- runtime/watchdog.c: --timeout, and which rank a hung collective waits for -------- */

/* A thread that aborts every rank when an armed deadline passes (seconds <= 0: none),
 * saying, when this rank waits in a collective, which ranks hold it up (see watchdog.c). */
int rt_watchdog_start(double seconds, char *err, size_t errlen);
/* Deadline now + seconds, for `what` ("step", 12) or, step < 0, `what` alone. */
void rt_watchdog_arm(const char *what, int64_t step);
void rt_watchdog_disarm(void);

/* Where a rank is, in memory the ranks of a node share (comm.c places them); opaque. */
typedef struct RtBeacon RtBeacon;
size_t rt_beacon_bytes(void);     // one cache line
void rt_beacon_clear(RtBeacon *b);
/* The beacons of the world: all[r] is rank r's, NULL for a rank that cannot be seen from
 * here (another node); all[rank] NULL keeps this rank's own private. The array is copied;
 * the beacons must stay mapped until rt_watchdog_detach. 0, or -1 with a message. */
int rt_watchdog_attach(int rank, int world, RtBeacon *const *all, char *err, size_t errlen);
void rt_watchdog_detach(void);
/* A pipeline: whole, the plan of every stage, and its data-parallel ranks per stage (rank
 * r is stage r / dp). A rank's collectives are counted against its own stage's ranks only,
 * ops are named as their stage's ("op 7 of stage 1"), and a send, receive or collective
 * over the stages names where the ranks of other stages it waits for are. whole must
 * outlive the watchdog; NULL (or one stage): no pipeline. */
void rt_watchdog_pipeline(const Plan *whole, int dp);
/* A device backend runs the step's collectives (CUDA ranks: NCCL, which the host does not
 * wait in): once a step is past its deadline and this rank waits in no MPI call, the
 * watchdog asks hung(ctx, msg, n) for the device's hung collective (backend.h) and says
 * it. NULL: none (the CPU backend's collectives are MPI's). */
void rt_watchdog_device(int (*hung)(void *ctx, char *msg, size_t n), void *ctx);
/* The main thread, around every collective and point-to-point op (comm.c; each a store
 * or two): entering one (its plan op, or for a blocking call outside the plan PLAN_NONE
 * over the world's ranks, RT_WAIT_STAGE over this stage's) gives its sequence number;
 * waiting for one says which (p and op, or `what` for a blocking call), until
 * rt_watchdog_waited. */
enum { RT_WAIT_STAGE = -2 };
int64_t rt_watchdog_enter(int32_t op);
void rt_watchdog_wait(int64_t seq, const Plan *p, int32_t op, const char *what);
void rt_watchdog_waited(void);

/* ---- runtime/device.c: where the steps run, behind one backend table --------------- */

typedef enum { RT_DEVICE_AUTO, RT_DEVICE_CPU, RT_DEVICE_CUDA, RT_DEVICE_COUNT } RtDeviceKind;

typedef struct {
    const RtBackendOps *ops;  // the backend that runs the steps: rt_backend_cpu() or CUDA's
    RtBackend *b;             // made by rt_device_open
    char name[200];           // for the start line: "cuda:0 NVIDIA H200 (sm_90)", "cpu (no CUDA driver)"
    int32_t *up, *down;       // each step: the inputs up before it, the reported outputs down after
    int n_up, n_down;
} RtDevice;

/* Chooses the backend for `want`: CUDA for RT_DEVICE_CUDA, and for RT_DEVICE_AUTO when
 * every rank has a GPU and the plan (the whole plan, every stage's program) a CUDA program (debug modes: the CPU); else the CPU, with the reason in d->name. Every
 * rank calls it and they agree. 0, or 1 after a message prefixed by `who` (RT_DEVICE_CUDA
 * where it cannot run; CUDA chosen, a plan larger than what the GPU of local_rank has
 * free: the backend's check_fit). */
int rt_device_choose(RtDevice *d, RtDeviceKind want, int debug, const Plan *p, int local_rank, const char *who);
/* Makes the chosen backend from e as it is now (initialized, weights loaded); the ids
 * in `report` (-1: none) come down after each step; trace: some steps will be timed
 * (rt_device_run_step_timed). 0, or -1 after a message. */
int rt_device_open(RtDevice *d, const Exec *e, const RtRanks *rk, int tf32, int trace, const int32_t *report,
                   int n_report);
int rt_device_is_cpu(const RtDevice *d);
/* Ops [from, to) of the step the last rt_device_step_in wrote; the whole step (graph: as
 * a captured CUDA graph, after the first). */
int rt_device_run_ops(RtDevice *d, int32_t from, int32_t to);
int rt_device_run_step(RtDevice *d, int graph);
/* The whole step op by op, each op timed on its stream into spans[op] (backend.h). */
int rt_device_run_step_timed(RtDevice *d, RtSpan *spans);
/* The bytes offload's copies moved since the device was opened, each way: the backend's
 * count, or on the CPU the Exec's (rt_exec_copied). */
void rt_device_copied(const RtDevice *d, const Exec *e, int64_t *to_host, int64_t *to_device);
/* Tensors up to the device from the host mirror (up), or down into it (nothing on the CPU). */
int rt_device_move(RtDevice *d, Exec *e, int up, const int32_t *ids, int n);
/* The step's moves: its step number and inputs up, its reports down. */
int rt_device_step_in(RtDevice *d, Exec *e, int64_t step);
int rt_device_step_out(RtDevice *d, Exec *e);
/* Down into the host mirror: every tensor of the roles (a bit each); roots only unless
 * `views` (a view lies in its root's bytes). */
int rt_device_download_roles(RtDevice *d, Exec *e, unsigned roles, int views);
/* A device backend's memory and kernels, two lines for the start; nothing for the CPU. */
void rt_device_report(const RtDevice *d, FILE *out);
/* Prints the backend's last failure (it names the rank, the call, the op) with the step
 * (step > 0). */
void rt_device_print_error(const RtDevice *d, int64_t step);
void rt_device_close(RtDevice *d);

/* ---- runtime/eval.c: evaluation on held-out data --------------------------------------- */

typedef struct RtEval RtEval;

typedef struct {
    const char *path;       // --val-data: NAME=FILE.npy,NAME=FILE.npy (any model), a token file (read as --data
                            // is), or "blobs" for a classifier
    RtTokenFormat format;   // how to read it
    int64_t batches;        // K: each evaluation's batches, the first K of the file's sequential order
    uint64_t seed;          // the run's (the data's, and the init the params are copied over)
    int nan_fill;           // --debug-nan for the eval program too
    const char *flag;       // the flag messages name (NULL: "--val-data")
    const uint8_t *optional;  // .npy: inputs that may have no file (rt_data_open_for), or NULL
    int mirror;             // the eval Exec is a device's host mirror (--predict on a device)
} RtEvalOptions;

/* The plan's evaluation program (whole->eval) on this rank, beside the training Exec
 * `train` whose params it evaluates (same rank and data-parallel world); NULL with a
 * message: a plan without one, data its inputs do not take, a bad file. train must
 * outlive it. */
RtEval *rt_eval_new(const Plan *whole, Exec *train, const RtEvalOptions *o, char *err, size_t errlen);
void rt_eval_free(RtEval *v);
/* Copies train's params in and runs the K batches: the mean loss (every rank's alike),
 * and for a classifier the accuracy over every rank's rows (else NAN). Every rank
 * calls it. 0, or -1 with a message. */
int rt_eval_run(RtEval *v, double *loss, double *accuracy, char *err, size_t errlen);
int64_t rt_eval_arena_bytes(const RtEval *v);  // the eval program's device arena
/* The eval program's Exec (this rank's stage) and its data, for --predict (predict.c). */
Exec *rt_eval_exec(RtEval *v);
RtData *rt_eval_data(RtEval *v);
/* Copies train's params into the eval program (rt_eval_run does it first). 0, or -1. */
int rt_eval_take_params(RtEval *v, char *err, size_t errlen);

/* ---- runtime/predict.c: fsexec --predict ----------------------------------------------- */

typedef struct {
    const char *data;       // --data: .npy files of the inputs (NAME=FILE.npy,... or a directory)
    const char *out;        // --out FILE.npy (several outputs: FILE.NAME.npy each)
    uint64_t seed;
    RtDevice *dev;          // chosen (rt_device_choose on the plan's eval program), not open
    const RtRanks *rk;      // this rank, for the device
    int tf32, graph;        // --tf32, --cuda-graph (a device's)
} RtPredictOptions;
/* Runs the plan's evaluation program over every sample of o->data, in order, with the
 * params of `train` (loaded by the caller; a device's host mirror holds them), on
 * o->dev (opened on the eval program here and closed before return), and writes each
 * output of the model (the eval program's outputs but the loss) as a .npy file of one
 * row per sample (see predict.c). Every rank calls it; the first rank of each stage
 * writes the outputs that stage holds. The paths written go to *written (for the
 * caller's message, with the device's name; may be NULL). 0, -1 with a message (agreed
 * over the ranks), or -2 when this rank's device or a batch failed (the message in err,
 * or printed by rt_device_open with err empty): the caller ends every rank, since the
 * others may wait in a collective. */
int rt_predict(const Plan *whole, Exec *train, const RtPredictOptions *o, char *written, size_t wlen, char *err,
               size_t errlen);

/* ---- runtime/sample.c: text generation --------------------------------------------------- */

typedef struct RtSampler RtSampler;
typedef struct RtTokenizer RtTokenizer;

typedef struct {
    int64_t n;            // tokens to generate
    double temperature;   // 0: the argmax
    int64_t top_k;        // keep the k most likely (0: all)
    uint64_t seed;        // the draws' key
} RtSampleOptions;

/* The plan's decode program (whole->decode: one token at a position, with KV caches) on
 * this process when kv_cache is set and the plan has one, else its sampling program
 * (whole->sample: the window of T tokens); params initialized from seed (then
 * --load-weights or a checkpoint into rt_sampler_exec); NULL with a message: a plan
 * that has none (not a language model), a 16-bit plan. */
RtSampler *rt_sampler_new(const Plan *whole, uint64_t seed, int kv_cache, char *err, size_t errlen);
void rt_sampler_free(RtSampler *s);
Exec *rt_sampler_exec(RtSampler *s);
int64_t rt_sampler_context(const RtSampler *s);  // T
int64_t rt_sampler_vocab(const RtSampler *s);    // V
/* For a text of n_total tokens (prompt and generated) with the decode program: past T + 1
 * tokens every token is a run of the sampling program instead (runtime/sample.c), whose
 * Exec this makes; *w is it, for the caller to load the weights into as into
 * rt_sampler_exec, or NULL when none is needed. 0, or -1 with a message. */
int rt_sampler_window(RtSampler *s, int64_t n_total, Exec **w, char *err, size_t errlen);
/* o->n tokens after the prompt into out, each from the logits of the last T tokens so
 * far (the decode program: from its caches; past T, the sampling program:
 * runtime/sample.c). 0, or -1 with a message (an empty prompt, a token outside the
 * vocab, no rt_sampler_window for a text past T + 1 tokens). */
int rt_sample(RtSampler *s, const RtSampleOptions *o, const int32_t *prompt, int64_t n_prompt, int32_t *out,
              char *err, size_t errlen);
/* An llm.c tokenizer file (gpt2_tokenizer.bin), for printing ids as text. */
RtTokenizer *rt_tokenizer_open(const char *path, char *err, size_t errlen);
void rt_tokenizer_free(RtTokenizer *t);
uint32_t rt_tokenizer_vocab(const RtTokenizer *t);
/* Token id's bytes to out ("<id>" for one outside its vocab); 0, or -1 on a write error. */
int rt_tokenizer_print(const RtTokenizer *t, int32_t id, FILE *out);

/* ---- runtime/trace.c: fsexec --trace, the steps as Chrome / Perfetto trace events ---- */

typedef struct RtTrace RtTrace;
/* Room to time steps first..last (inclusive) of the Exec's program; NULL with a message. */
RtTrace *rt_trace_new(const Exec *e, int64_t first, int64_t last, char *err, size_t errlen);
void rt_trace_free(RtTrace *t);
/* Just before the backend runs step `step` (every rank calls it for every step, t may be
 * NULL): the spans to time it into (rt_device_run_step_timed), or NULL when the step is not
 * traced. Before the first traced step the ranks agree (the clocks' common origin). */
RtSpan *rt_trace_step(RtTrace *t, int64_t step);
/* Every rank calls it once after its steps: rank 0 gathers every rank's spans and writes
 * the trace at path (a JSON object: traceEvents, displayTimeUnit, otherData). 0, or -1
 * with a message (on rank 0). */
int rt_trace_write(const RtTrace *t, const char *path, char *err, size_t errlen);

/* ---- runtime/step.c: the step loop ----------------------------------------------------- */

typedef struct {
    int64_t steps;            // the run's last step
    int64_t start;            // the steps done before (a resumed run): the first is start + 1
    const RtCheckpointOptions *checkpoint;  // where checkpoints go, or NULL for none
    int64_t save_every;       // a checkpoint every N steps (0: only at the end, and when stopped)
    int64_t *reached;         // the last step done, or NULL
    volatile const sig_atomic_t *stop;  // set (rt_signals_catch's flag) to stop at the next step boundary, after
                              // a checkpoint (or right after the save it came in); NULL: never
    int *stopped_by;          // the flag the ranks agreed to stop for (the largest any saw), or NULL
    int64_t overflow_at;      // debug: the fp16 backward seed (PLAN_SR_LOSS_SEED) made infinite at this step
    const char *save_grads;   // step 1's gradients into this file (world 1), or NULL
    int cuda_graph;           // a device backend captures step 2 and replays it
    RtTrace *trace;           // the steps it covers are run timed (rt_trace_step), or NULL
    int debug_nan;            // the run fills dead buffers with NaN (the message for a NaN loss says so)
    const char *who;          // before every message: "fsexec", "[rank 3] fsexec"
    const char *path;         // the plan's path, for messages
    int rank, world;
    RtEval *eval;             // --val-data: evaluated before the first step (of a run from step 0),
    int64_t eval_every;       // every eval_every steps, and after the last; NULL: never
} RtTrainOptions;

enum {
    RT_TRAIN_LOCAL = -1,   // an error of this rank alone: the caller ends every rank
    RT_TRAIN_STOPPED = -3  // stopped by *stop at a step boundary (every rank alike), the checkpoint saved
};

/* The steps: each step's batch (rt_data_fill) into the host mirror, its inputs up, the
 * step on the device, the reported scalars down, a progress line (rank 0: *progress;
 * ended and set to NULL when a step fails). Every figure comes from a tensor found by
 * its step role. 0; 1 after a message every rank prints alike (a loss that is not
 * finite); RT_TRAIN_LOCAL after a message about this rank's error. Allocates nothing
 * (but --save-grads' file). */
int rt_train(Exec *e, RtData *data, RtDevice *d, Progress **progress, const RtTrainOptions *o);
/* The ids a device sends down after each step (for rt_device_open): the loss, the
 * scalars of the progress line, a classifier's logits. Fills ids (8 entries); the count. */
int rt_train_reported(const Exec *e, const RtData *data, int32_t *ids);

#endif
