/* plan/plan.h: the plan file, the one thing the compiler (fsc) and the runtime (fsexec)
 * share. This layer depends on neither: it knows tensors, ops and attributes as plain
 * arrays of integers and string ids, never the IR's enums, so the file format does not
 * change when ops/ops.def is reordered (an op is stored by NAME).
 *
 * In memory a Plan is a handful of arrays that refer to each other by index, like the
 * IR: tensors and ops by id, strings by id into one string table, the inputs and
 * outputs of every op as ranges in one id pool, attributes as ranges in one attr pool.
 *
 * On disk (all integers little-endian, whatever the host):
 *
 *   offset  size
 *   0       8     magic "\x89FSP\r\n\x1a\n" (PNG-style: catches 7-bit and CRLF damage)
 *   8       2     major version (a reader refuses a newer major)
 *   10      2     minor version (a newer minor only adds: it is read, extras skipped)
 *   12      4     number of sections
 *   16      8     total file size in bytes
 *   24      4     CRC-32 of the header and section table, this field read as zero
 *   28      4     reserved, 0
 *   32      24*n  section table: tag[4], CRC-32 u32, offset u64, length u64
 *   ...           the sections, back to back in table order, up to the end of the file
 *
 * Every byte of the file is covered by a checksum. The sections of version 2 (STRS,
 * META, BLKS, TENS, NODE, IDS, ATTR, INTS, OUTS, PROG, all required; CUDA, the CUDA
 * program, and CUMD, its module text, optional: a plan without a memory plan has
 * neither) and their records are laid out in plan/format.h; a reader skips tags it does
 * not know. A 1.x file (one op list, one arena, the CUDA text in META) is refused with a
 * message that says to recompile it. A section of records
 * starts with its record count and record size, so a newer minor version can append
 * fields (2.1 did: an op's micro-batch and FLOPs, a program's ranges; 2.2 a tensor's
 * logical rows; 2.0 and 2.1 files read).
 *
 * Reading checks the magic, version, header checksum, size, bounds and every section's
 * checksum, each with its own message, before it decodes anything; decoding then checks
 * every count, id and range, so that no file, however made, can crash the reader.
 */
#ifndef FS_PLAN_H
#define FS_PLAN_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#define PLAN_MAJOR 2
#define PLAN_MINOR 2
#define PLAN_MAX_RANK 6
#define PLAN_NONE (-1)  // an absent string, block, producer or tied tensor

/* ---- the small enums of the format (their numbers are part of it) --------------- */

typedef enum { PLAN_DT_F32, PLAN_DT_F16, PLAN_DT_BF16, PLAN_DT_I32, PLAN_DT_COUNT } PlanDType;
typedef enum {
    PLAN_ROLE_INPUT, PLAN_ROLE_PARAM, PLAN_ROLE_GRAD, PLAN_ROLE_ACT, PLAN_ROLE_OPT_STATE,
    PLAN_ROLE_MASTER, PLAN_ROLE_COMM, PLAN_ROLE_SCRATCH, PLAN_ROLE_CONST, PLAN_ROLE_GATHERED, PLAN_ROLE_KV_CACHE,
    PLAN_ROLE_PARAM16, PLAN_ROLE_COUNT
} PlanRole;
/* A tensor's memory space: each program has one arena per space (device memory; pinned
 * host memory), and a tensor's offset is into its space's arena. */
typedef enum { PLAN_PLACE_DEVICE, PLAN_PLACE_HOST, PLAN_PLACE_COUNT } PlanPlace;
/* The stream an op runs on (the schedule pass decides): compute ops in program order on
 * one stream, collectives (and later point-to-point) on another, host-device copies on a
 * third. An op on another stream than compute starts after every compute op before it in
 * the program; a compute op waits for exactly the ops its PlanOp.wait range names. */
typedef enum { PLAN_STREAM_COMPUTE, PLAN_STREAM_COLLECTIVE, PLAN_STREAM_COPY, PLAN_STREAM_COUNT } PlanStream;
/* What the step loop needs of a tensor, so it never finds one by name: the step's loss
 * (the output the progress line shows), the learning rate and the global gradient norm
 * of the step (outputs), the fp16 loss scale (state), the step number the runtime writes
 * (input), the optimizer's step counter (state: the step was skipped when it did not
 * move), the backward's seed (fp16: the loss scale; --debug-overflow-at poisons it), and
 * the RNG words dropout reads (input, i32 [4]: the run's seed low and high 32 bits, the
 * step, the rank's data-parallel index), which the runtime writes; a decode program's
 * position (input, i32 [1]: where its token is), which the sampler writes.
 * At most one tensor of each program has each role. */
typedef enum {
    PLAN_SR_NONE, PLAN_SR_LOSS, PLAN_SR_LR, PLAN_SR_GRAD_NORM, PLAN_SR_LOSS_SCALE, PLAN_SR_STEP, PLAN_SR_OPT_STEP,
    PLAN_SR_LOSS_SEED, PLAN_SR_RNG, PLAN_SR_POS, PLAN_SR_COUNT
} PlanStepRole;
typedef enum {
    PLAN_PHASE_FORWARD, PLAN_PHASE_BACKWARD, PLAN_PHASE_RECOMPUTE, PLAN_PHASE_OPTIMIZER,
    PLAN_PHASE_COMM, PLAN_PHASE_WGRAD, PLAN_PHASE_COUNT
} PlanPhase;
typedef enum { PLAN_INIT_NONE, PLAN_INIT_ZEROS, PLAN_INIT_ONES, PLAN_INIT_NORMAL, PLAN_INIT_UNIFORM, PLAN_INIT_FULL, PLAN_INIT_COUNT } PlanInit;
typedef enum { PLAN_META_STR, PLAN_META_INT, PLAN_META_FLOAT, PLAN_META_COUNT } PlanMetaKind;
typedef enum { PLAN_ATTR_INT, PLAN_ATTR_FLOAT, PLAN_ATTR_INTS, PLAN_ATTR_COUNT } PlanAttrKind;

/* ---- the in-memory plan ----------------------------------------------------------- */

/* A typed setting: model name, compiler version, every training setting. */
typedef struct {
    int32_t key;        // string id
    PlanMetaKind kind;
    int32_t s;          // PLAN_META_STR: string id
    int64_t i;          // PLAN_META_INT
    double f;           // PLAN_META_FLOAT
} PlanMeta;

typedef struct {
    int32_t name;   // string id: "h.3"
    int32_t layer;  // string id: "Block"
    int32_t index;  // 3
} PlanBlock;

typedef struct {
    int32_t name;       // string id, PLAN_NONE for unnamed intermediates
    PlanDType dtype;
    PlanRole role;
    PlanPlace place;
    PlanInit init;      // params: how they start
    int32_t rank;       // 0..PLAN_MAX_RANK; 0 is a scalar
    int64_t shape[PLAN_MAX_RANK];  // elements along each dim, >= 0
    int32_t block;      // block id or PLAN_NONE
    int32_t producer;   // op id or PLAN_NONE (inputs, params, constants)
    int32_t tied_to;    // tensor id of the param this one aliases, or PLAN_NONE
    double init_a, init_b;  // normal: (std, mean); uniform: (low, high)
    int32_t grad;       // params: the tensor holding its gradient, or PLAN_NONE
    PlanStepRole step_role;  // what the step loop reads or writes it for; PLAN_SR_NONE
    /* The memory plan (memplan): where the tensor lives in its rank's arena of its space
     * (`place`; the program's space_bytes long) and when. Checked by the executor. */
    int64_t offset;     // bytes from the start of its space's arena
    int32_t live_start, live_end;  // first writer and last reader, op ids; n_ops: to the step's end
    int32_t alias;      // the root tensor whose buffer this view lies in, or PLAN_NONE
    int64_t rank_stride;  // bytes added to offset per rank: rank r's data is at
                          // offset + r * rank_stride (a rank's shard of a flat buffer)
    int32_t unit;       // flat layout (sharding): the unit whose flat buffer this lies in,
                        // group x (n_blocks + 2) + (block, n_blocks for the params outside
                        // blocks, n_blocks + 1 for a pipeline stage's copies of params another
                        // stage also holds), group: decayed, not decayed, frozen; below
                        // PLAN_UNITS(n_blocks); PLAN_NONE
    int64_t flat_offset;  // elements: a param's start in its unit's flat layout; for a
                          // unit's storage, rank 0's first element (see sharded)
    uint8_t sharded;    // storage holding only this rank's shard of its unit: rank r
                        // holds flat elements [flat_offset + r * numel, + numel)
    int64_t logical_rows;  // a param whose rows the compiler padded (passes/pad_vocab.c): the model's
                           // own shape[0], its logical tensor the first elements; 0: not padded (2.2)
} PlanTensor;
#define PLAN_UNITS(n_blocks) (3 * ((n_blocks) + 2))  // units of a plan (ir_unit_count)

typedef struct {
    int32_t op;         // string id of the op's name ("matmul")
    int32_t block;      // block id or PLAN_NONE
    PlanPhase phase;
    int32_t line, col;  // the source location that made it; 0: none
    int32_t in, n_in;   // range in Plan.ids: input tensor ids
    int32_t out, n_out; // range in Plan.ids: output tensor ids
    int32_t attr, n_attr;  // range in Plan.attrs
    /* The schedule (passes/schedule.c), executed as stored by every backend. */
    PlanStream stream;
    int32_t wait, n_wait;  // range in Plan.waits: op ids, earlier in the program and off
                           // the compute stream, that must be complete before this op starts
    /* For reports (the timeline), never for running: the micro-batch the op works on
     * (PLAN_NONE: the step's own ops, the optimizer's), and its FLOPs (the cost model). */
    int32_t microbatch;
    double flops;
} PlanOp;

/* One program: what the ranks of one pipeline stage run each step. Its data-parallel
 * ranks share it (a rank's shard is at offset + dp_index * rank_stride), so the plan
 * does not grow with the data-parallel world. Rank r runs program r / dp_world as
 * data-parallel index r % dp_world; every program has the same dp_world, and the world
 * is n_programs x dp_world. Programs hold consecutive ranges of Plan.ops, Plan.tensors
 * and Plan.outputs, in stage order, and refer only to their own: an op's tensors, a
 * tensor's producer, grad, alias and tied tensor, the waits and the CUDA instructions
 * of a program's ops all lie in its ranges. Point-to-point ops (send, recv) name the
 * peer program by its stage. The CUDA module is one text per program, back to back. */
typedef struct {
    int32_t stage;       // the pipeline stage, 0-based (programs are in stage order)
    int32_t dp_world;    // data-parallel ranks that run it
    int32_t first_op, n_ops;  // range in Plan.ops, in issue order
    int64_t space_bytes[PLAN_PLACE_COUNT];  // the arena of each memory space, per rank
    int32_t first_tensor, n_tensors;        // range in Plan.tensors
    int32_t first_output, n_outputs;        // range in Plan.outputs; the first is the loss
    int64_t module_at, module_len;          // bytes of Plan.cuda_module: this program's module
} PlanProgram;

typedef struct {
    int32_t key;        // string id
    PlanAttrKind kind;
    int64_t i;          // PLAN_ATTR_INT
    double f;           // PLAN_ATTR_FLOAT
    int32_t list, n_list;  // PLAN_ATTR_INTS: range in Plan.ints
} PlanAttr;

/* The CUDA program (codegen/cuda_*.c): what the CUDA backend runs for each
 * op, in op order. An op has zero or more instructions, sorted by op id: none for a view
 * whose output already lies in its input's bytes, for a collective (the runtime runs it on
 * NCCL by the op's name, as the CPU backend does on MPI), and for the members of a fused
 * group but its last, whose one LAUNCH computes the whole group.
 *
 * LAUNCH: kernel `kernel` (a string id: its name, `PREFIX_HASH`, defined in the plan's
 *   CUDA module, Plan.cuda_module) with grid x block threads and `smem` bytes of
 *   dynamic shared memory. Its parameters are exactly the args, in order, each a device
 *   pointer to that tensor's bytes on this rank (arena + offset + rank * rank_stride);
 *   every shape is compiled into the kernel.
 * GEMM: cuBLAS, row-major as torch.matmul: for b < batch, C_b = op(A_b) @ op(B_b), with
 *   args {A, B, C}; A_b starts at A + b * stride_a elements (likewise B, C; a stride may
 *   be 0 to broadcast); op transposes when ta/tb is set. C is [m, n] with row stride ldc;
 *   A is [m, k] (ta: [k, m]) with row stride lda; B is [k, n] (tb: [n, k]) with row
 *   stride ldb. a_off, b_off, c_off: element offsets added to each base first (a matmul
 *   whose batch does not fold into one strided call is several GEMMs). Accumulation is
 *   f32 whatever the dtypes; C is written (beta 0), or under `beta` written as the
 *   product plus R (below). */
typedef enum { PLAN_CU_LAUNCH, PLAN_CU_GEMM, PLAN_CU_COUNT } PlanCuKind;

/* A GEMM's epilogue (passes/epilogue.c, cuBLASLt's on CUDA), on a GEMM of batch 1 with no
 * offsets. args {A, B, C, bias, aux}: BIAS: C = A B + bias [n]; GELU_AUX_BIAS: aux [m, n]
 * (row stride ldc) = A B + bias, C = gelu(aux); DGELU_BGRAD: C = gelu'(aux) * (A B), bias
 * [n] = C summed over its m rows; BGRAD_A: bias [m] = op(A) summed over k (A stored [k, m]:
 * ta); BGRAD_B: bias [n] = op(B) summed over k (B stored [k, n]: no tb). */
typedef enum {
    PLAN_EPI_NONE, PLAN_EPI_BIAS, PLAN_EPI_GELU_AUX_BIAS, PLAN_EPI_DGELU_BGRAD, PLAN_EPI_BGRAD_A, PLAN_EPI_BGRAD_B,
    PLAN_EPI_COUNT
} PlanEpilogue;
/* The args an epilogue adds after A, B, C: bias, then aux. A GEMM with beta 1 adds one more
 * last, R: C = op(A) op(B) + R (epilogue NONE), or + bias + R (BIAS); R [m, n] of C's dtype
 * and row stride ldc, never C's bytes (cuBLASLt's C, the plan's C its D; batch 1). */
static inline int plan_epilogue_args(int epi)
{
    if (epi == PLAN_EPI_GELU_AUX_BIAS || epi == PLAN_EPI_DGELU_BGRAD) return 2;
    return epi > PLAN_EPI_NONE && epi < PLAN_EPI_COUNT;
}

typedef struct {
    int32_t op;            // the plan op this instruction runs for
    PlanCuKind kind;
    int32_t kernel;        // LAUNCH: string id of the kernel's name; else PLAN_NONE
    int32_t args, n_args;  // range in Plan.ids: tensor ids (LAUNCH: the kernel's parameters; GEMM: A, B, C, then
                           // its epilogue's bias and aux, then R under beta)
    int32_t grid[3], block[3];
    int32_t smem;          // LAUNCH: dynamic shared memory, bytes
    int32_t ta, tb;        // GEMM
    int32_t epilogue;      // GEMM: a PlanEpilogue (byte 5 of the record; 0 in plans before it)
    int32_t beta;          // GEMM: 1 when R is added (its last arg), else 0 (byte 6; 0 in plans before it)
    int64_t m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c, batch, a_off, b_off, c_off;
} PlanCuda;

/* A section as the file lists it; filled by plan_read, for inspection. */
typedef struct {
    char tag[5];        // printable (other bytes shown as '?'), NUL-terminated
    uint32_t crc;
    uint64_t offset, length;
} PlanSection;

typedef struct Plan {
    uint16_t major, minor;  // the file's version (PLAN_MAJOR/MINOR for a new plan)
    char **strs;            // the string table, each NUL-terminated
    int32_t n_strs;
    PlanMeta *meta;
    int32_t n_meta;
    PlanBlock *blocks;
    int32_t n_blocks;
    PlanTensor *tensors;    // the IR's values, same ids
    int32_t n_tensors;
    PlanOp *ops;            // the IR's nodes, same ids
    int32_t n_ops;
    int32_t *ids;           // tensor ids, for PlanOp in/out ranges
    int32_t n_ids;
    PlanAttr *attrs;
    int32_t n_attrs;
    int64_t *ints;          // PLAN_ATTR_INTS lists
    int32_t n_ints;
    int32_t *outputs;       // tensor ids the step produces; outputs[0] is the loss
    int32_t n_outputs;
    int32_t *waits;         // op ids, for PlanOp wait ranges
    int32_t n_waits;
    PlanProgram *programs;  // one per pipeline stage, in stage order (at least one)
    int32_t n_programs;
    PlanCuda *cuda;         // the CUDA program, sorted by op (none without a memory plan)
    int32_t n_cuda;
    char *cuda_module;      // the CUDA C source the LAUNCH kernels are defined in, or NULL
    /* Forward-only programs fsc planned beside the training program, each a plan of one
     * program with its own arena (sections EVAL and SAMP hold them as whole plan files),
     * or NULL: the evaluation program (the training forward and loss of the global batch
     * over the same data-parallel ranks) and the sampling program (one sequence, world 1);
     * section DECO the decode program (the sampling program's forward of one token at a
     * position, with KV caches: passes/decode.c), or NULL where the model cannot decode. */
    struct Plan *eval, *sample, *decode;
    PlanSection *sections;  // as read from a file; none for a plan built in memory
    int32_t n_sections;
    struct PlanBuild *build;  // growth state while a plan is being built
} Plan;

/* ---- plan/alloc.c: the allocation hook -------------------------------------------- */

/* Every allocation this layer makes goes through these (malloc and free by default), so
 * tests can make the k-th one fail. NULL restores the defaults. */
void plan_set_alloc(void *(*alloc_fn)(size_t), void (*free_fn)(void *));
void *plan_alloc(size_t n);  // NULL on failure; n == 0 allocates one byte
void plan_dealloc(void *p);

/* ---- plan/fail.c: error messages ---------------------------------------------------- */

/* Formats a message into err (errlen bytes) and returns -1: `return plan_fail(...)`. */
int plan_fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int plan_vfail(char *err, size_t errlen, const char *fmt, va_list ap);

/* ---- plan/build.c: making a plan in memory, and reading one ---------------------- */

Plan *plan_new(void);  // empty, version PLAN_MAJOR.PLAN_MINOR; NULL when out of memory
void plan_free(Plan *p);

/* Each returns the new item's id (the string's id; 0 for meta), or -1 when out of
 * memory; after a failure the plan stays valid (at most a string more) and can be freed.
 * plan_meta_set_* replaces an existing key's value. */
int32_t plan_intern(Plan *p, const char *s);  // the id of s, added once
int plan_meta_set_str(Plan *p, const char *key, const char *value);
int plan_meta_set_int(Plan *p, const char *key, int64_t value);
int plan_meta_set_float(Plan *p, const char *key, double value);
int32_t plan_block_add(Plan *p, const char *name, const char *layer, int32_t index);
int32_t plan_tensor_add(Plan *p, const PlanTensor *t);
int32_t plan_id_add(Plan *p, int32_t id);
int32_t plan_int_add(Plan *p, int64_t v);
int32_t plan_attr_add(Plan *p, const PlanAttr *a);
int32_t plan_op_add(Plan *p, const PlanOp *op);
int32_t plan_output_add(Plan *p, int32_t tensor);
int32_t plan_cuda_add(Plan *p, const PlanCuda *c);
int32_t plan_program_add(Plan *p, const PlanProgram *prog);
int32_t plan_wait_add(Plan *p, int32_t op);
/* Makes the plan's programs exactly one: stage 0, every op (call it after the last op is
 * added), dp_world ranks, the two spaces' arenas. 0, or -1 when out of memory. An op,
 * tensor or output added later, where the last program's range of its kind ends, joins
 * that program. */
int plan_set_one_program(Plan *p, int32_t dp_world, int64_t device_bytes, int64_t host_bytes);
/* Replaces the CUDA module text (copied), which is then program 0's when the plan has
 * one program; 0, or -1 when out of memory. */
int plan_set_cuda_module(Plan *p, const char *text);

/* "" for PLAN_NONE or an id out of range. */
const char *plan_str(const Plan *p, int32_t id);
/* The last meta entry named key, or NULL. */
const PlanMeta *plan_meta_find(const Plan *p, const char *key);
const char *plan_meta_str(const Plan *p, const char *key, const char *def);
int64_t plan_meta_int(const Plan *p, const char *key, int64_t def);
double plan_meta_float(const Plan *p, const char *key, double def);

const char *plan_dtype_name(PlanDType t);  // "f32", "f16", "bf16", "i32"; "?" if unknown
int plan_dtype_size(PlanDType t);          // bytes per element; 0 if unknown
const char *plan_role_name(PlanRole r);    // "input", "param", "grad", "act", ...
const char *plan_place_name(PlanPlace p);  // "device", "host"
const char *plan_stream_name(PlanStream s);  // "compute", "collective", "copy"
const char *plan_step_role_name(PlanStepRole r);  // "none", "loss", "lr", "grad_norm", ...
/* The tensor with step role r (the first: program 0's in a plan of several), or PLAN_NONE. */
int32_t plan_role_tensor(const Plan *p, PlanStepRole r);
/* The bytes of space s's arena in program 0 (every rank's in a plan of one program), or
 * -1 when the plan has no program. */
int64_t plan_space_bytes(const Plan *p, PlanPlace s);
const char *plan_phase_name(PlanPhase p);  // "forward", "backward", ...
const char *plan_epilogue_name(int e);     // a PlanEpilogue: "none", "bias", "gelu_aux_bias", ...
const char *plan_init_name(PlanInit k);    // "none", "zeros", "ones", "normal", "uniform"

/* Whether t is one of the model's params, counted once: named, not tied to another, and
 * not a flat buffer or shard that holds params (the shard pass's storage). */
int plan_tensor_is_model_param(const PlanTensor *t);
/* Whether t lives across steps: params, optimizer state, master weights, inputs. */
int plan_tensor_is_persistent(const PlanTensor *t);
/* Tensor id's name for messages, "(unnamed)" for none. */
const char *plan_tensor_label(const Plan *p, int32_t id);

/* Elements and bytes of a tensor (shapes are checked by the reader to fit in int64). */
int64_t plan_tensor_numel(const PlanTensor *t);
int64_t plan_tensor_nbytes(const PlanTensor *t);
/* The model's own tensor of a padded param (logical_rows; else the tensor as stored): its
 * elements, the first of the stored ones, and its shape into shape (PLAN_MAX_RANK). */
int64_t plan_tensor_logical_numel(const PlanTensor *t);
void plan_tensor_logical_shape(const PlanTensor *t, int64_t *shape);

/* ---- plan/comm_op.c: shard groups and host ops (its communication helpers: comm_op.h) */

/* The ranks a shard is split over (meta "shard_group"; hybrid sharding) among a stage's
 * dp_world data-parallel ranks: dp_world when unset or not a divisor of it. Index d
 * holds shard d % S (a view's offset + (d % S) * rank_stride), in shard group d / S. */
int64_t plan_shard_group(const Plan *p, int64_t dp_world);
/* Whether op k computes in the host space (offload's update and casts): it is not a copy
 * between the spaces (to_host, to_device) and its tensors lie there (plan_check: an op
 * but a copy touches one space). The backends run such an op on the host. */
int plan_op_on_host(const Plan *p, int32_t k);

/* ---- plan/program.c: plans of several programs (pipeline stages) ------------------- */

/* Appends `one`, a plan of one program (codegen builds one per stage), to `p` as its
 * next program (stage p->n_programs): every id of one's tensors, ops, outputs, waits
 * and CUDA instructions moves by where its ranges start in p, strings are interned
 * again, attributes and lists copied, its CUDA module appended. The first append also
 * takes one's meta and blocks; a later one must have the same blocks. 0, or -1 with a
 * message (p is then not usable). */
int plan_append_program(Plan *p, const Plan *one, char *err, size_t errlen);
/* A new plan of program k of p alone, as one stage's ranks run it: that program's
 * tensors, ops, outputs, waits, CUDA instructions and module, ids from 0, and one
 * program (stage k, its dp_world); meta, blocks and strings as p's. Needs plan_check.
 * NULL with a message when out of memory. */
Plan *plan_extract_program(const Plan *p, int32_t k, char *err, size_t errlen);

/* ---- plan/p2p.c: the pipeline's point-to-point schedule ------------------------------ */

/* Whether the programs' sends and receives can run as stored without a deadlock, even
 * when every send is synchronous (completes only once its receive has started; no
 * reliance on MPI's eager buffering): the k-th send from stage a to stage b meets the
 * k-th receive on b from a, with the same dtype and elements; every collective over
 * the pipeline group (group 1) meets its counterpart, in the same order, on every
 * program; and a simulation of all programs, where an op starts once the ops its waits
 * name are complete (a send or receive: when its partner has started; a pipeline
 * collective: when every program has started it) and every program ends with nothing
 * pending, finishes. 0, or -1 with a message naming the stages and ops that wait on
 * each other. Needs plan_check. A plan of one program passes. */
int plan_check_p2p(const Plan *p, char *err, size_t errlen);

/* ---- plan/check.c ------------------------------------------------------------------ */

/* Checks every string id, tensor id, range and enum of a plan, so code that walks one
 * can index without checking. 0, or -1 with a message ("tensor 12: block 9 out of range
 * (4 blocks)"). plan_read runs it on every file, plan_write on every plan. */
int plan_check(const Plan *p, char *err, size_t errlen);

/* ---- plan/schedule.c ---------------------------------------------------------------- */

/* Whether the stored schedule is safe as stored on `rank`: no op reads or writes bytes
 * of an op still in flight on another stream (one no wait has completed). 0, or -1 with
 * a message naming both ops. Needs plan_check; the executor runs it for its rank. */
int plan_check_schedule(const Plan *p, int rank, char *err, size_t errlen);

/* ---- plan/write.c ------------------------------------------------------------------ */

/* Encodes the plan into a new buffer (free with plan_dealloc). 0, or -1 with a message. */
int plan_write_mem(const Plan *p, void **buf, size_t *len, char *err, size_t errlen);
/* Writes the plan to path atomically: a temporary file in the same directory, flushed
 * and fsync'ed, then renamed over path. On failure path is untouched and no temporary
 * file is left. 0, or -1 with a message (without the path) in err. */
int plan_write(const Plan *p, const char *path, char *err, size_t errlen);

/* ---- plan/atomic.c ----------------------------------------------------------------- */

typedef struct {
    const void *data;
    size_t len;
} PlanChunk;

/* plan/input.c: opens path to read, only when it is a regular file, without ever
 * blocking (a FIFO is an error, not a hang); the descriptor, its size in *size, or -1
 * with err saying what the path is. */
int plan_open_input(const char *path, int64_t *size, char *err, size_t errlen);
/* What a file of this st_mode is, for messages: "a directory", "a FIFO (named pipe)", ... */
const char *plan_file_kind(unsigned mode);
/* A JSON parser's message (jansson's error text) without the input it quotes (" near
 * 'ZQXJ...'"): a message about a file's content says where and what was expected, never
 * the bytes themselves. Into buf; returns buf. */
const char *plan_json_why(const char *text, char *buf, size_t n);
/* Writes the chunks, in order, as the file at path: to a temporary file in the same
 * directory, fsync'ed, then renamed over path (over the file a symlink points to). On
 * failure path is untouched and no temporary file is left; stale temporary files of path
 * (their writer is gone) are removed first. A character device or a FIFO at path is
 * written into, never replaced; a directory, block device or socket is refused. 0, or
 * -1 with a message (without the path) in err. */
int plan_write_atomic(const char *path, const PlanChunk *chunks, int n, char *err, size_t errlen);
/* The same, written piece by piece (an output too large to hold: a consolidated
 * checkpoint): open, write in order (a failure is kept and reported by commit), then
 * commit (fsync, rename, sync the directory) or abort (the temporary file goes; path is
 * untouched). Both free the PlanOutput. */
typedef struct PlanOutput PlanOutput;
PlanOutput *plan_output_open(const char *path, char *err, size_t errlen);
int plan_output_write(PlanOutput *o, const void *data, size_t len);  // 0, or -1 once any write failed
int plan_output_commit(PlanOutput *o, char *err, size_t errlen);
void plan_output_abort(PlanOutput *o);
/* For a signal handler (async-signal-safe): removes the temporary file being written now,
 * if any; the write it belongs to is never committed (the process is ending). */
void plan_output_abandon(void);
/* The temporary file a writer of its own (runtime/ckfs.c) has open now, as plan_output_open
 * records its own, for plan_output_abandon and plan_output_on_open's hook; NULL once it is
 * renamed or removed. */
void plan_output_pending(const char *tmp);
/* Test-only (runtime/signals.c's FSEXEC_TEST_SIGNAL): hook is called once, the next time a
 * temporary file has been opened; NULL: none. */
void plan_output_on_open(void (*hook)(void));
/* Whether plan_write_atomic could write path, checked before a long run rather than
 * after it: not a directory (or block device, socket), its directory exists and is
 * writable. 0, or -1 with a message (without the path): "is a directory; give a file
 * name", "cannot write in out: No such file or directory". */
int plan_check_output(const char *path, char *err, size_t errlen);
/* For a tool's start, before any output: gives stdout a 64 KiB buffer (lines on a
 * terminal), so that what most commands print (--help, a report) is written at exit, by
 * plan_stdout_close, where a failure is seen with its reason. */
void plan_stdout_open(void);
/* For a tool's exit: flushes and closes stdout; 0, or -1 with "error writing to standard
 * output: No space left on device" in err (the tool then exits 1). */
int plan_stdout_close(char *err, size_t errlen);

/* ---- plan/read.c ------------------------------------------------------------------- */

/* The plan in buf, or NULL with a message in err ("truncated: ...", "not an fsc plan
 * (bad magic)", "section NODE: checksum mismatch (file damaged)", ...). */
Plan *plan_read_mem(const void *buf, size_t len, char *err, size_t errlen);
/* The same for a file; messages do not repeat the path. */
Plan *plan_read(const char *path, char *err, size_t errlen);

/* ---- plan/crc32.c ------------------------------------------------------------------ */

/* CRC-32 (IEEE 802.3, as zlib and PNG): crc = plan_crc32(0, buf, n) or continue one. */
uint32_t plan_crc32(uint32_t crc, const void *buf, size_t n);
/* FNV-1a 64: h = plan_fnv1a(PLAN_FNV1A_INIT, buf, n) or continue one. */
#define PLAN_FNV1A_INIT 0xcbf29ce484222325ull
uint64_t plan_fnv1a(uint64_t h, const void *buf, size_t n);

#endif
