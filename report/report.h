/* report/report.h: what a plan asks of memory and time, for people. Computed from the
 * plan alone (plan/plan.h), so `fsc --mem` (a plan built in memory, never written) and
 * `fsexec --inspect` (a plan read from a file) print the same numbers from the same code.
 *
 * A plan has one program per pipeline stage, each shared by the stage's dp_world
 * data-parallel ranks (stage s: ranks s * dp_world .. s * dp_world + dp_world - 1). The
 * memory report is of one program: a plan of one program has one, labelled "ranks
 * 0-(world-1)"; a plan of several has one per stage (MemStages), each of the program
 * extracted alone, labelled "stage s of P (ranks a-b)". Every byte count is of one rank.
 * The timeline (report/timeline.c) is of the whole plan: every stage's tasks on one
 * logical clock.
 *
 * Where it sits: after codegen in fsc, after plan_read in fsexec. Depends on plan/ and
 * jansson, and the op table (ops/ops.h) for what each op is. Grouped by the file that
 * defines each declaration.
 */
#ifndef FS_REPORT_H
#define FS_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "ops.h"
#include "plan.h"

/* ---- report/memreport.c: the analysis ------------------------------------------------ */

/* What each buffer of the arena is for. A view counts as its root buffer. Model state
 * comes first, in ZeRO's categories (report/memstate.c says what each holds): a param's
 * 16-bit copy is 16-bit params whatever made it (a 16-bit storage, a cast the forward
 * reads, a gather kept for the step, a host-to-device copy), fp32 params are the fp32
 * storage (the master under mixed precision), grads are split by dtype. Gathered params
 * are the per-use gathers of fsdp (transient, not model state). An activation is "saved"
 * when a forward op makes it and a backward (or recompute) op reads it. */
typedef enum {
    MEM_PARAMS16, MEM_GRADS16, MEM_PARAMS32, MEM_GRADS32, MEM_OPT_STATE, MEM_GATHERED, MEM_INPUTS, MEM_SAVED,
    MEM_RECOMPUTE, MEM_ACTS, MEM_COMM, MEM_SCRATCH, MEM_CONSTS, MEM_KV_CACHE, MEM_CAT_COUNT
} MemCategory;

enum { MEM_TOP_N = 10 };

/* A buffer live at the peak. */
typedef struct {
    int32_t tensor;      // root tensor id
    int64_t bytes;
    MemCategory cat;
} MemTensor;

typedef struct MemReport {
    const Plan *plan;             // one program: the plan's, or the stage's extracted alone
    int64_t world;                // data-parallel ranks that run this program
    int32_t stage, n_stages;      // the pipeline stage it is of, of n_stages; 0 of 1 for a
                                  // plan of one program (then printed as it always was)
    Plan *own;                    // the program extracted from a plan of several; NULL
    int64_t arena_bytes;          // the device space's arena (program 0)
    int64_t host_arena_bytes;     // the host space's arena (pinned host memory on CUDA ranks)
    int32_t n_points;             // points of the timeline: one per op (at least one)
    /* Bytes of root buffers live at each op (live_start <= i <= live_end), by where
     * they live: [place][point], and by category: [place][point * MEM_CAT_COUNT + c]. */
    int64_t *live[PLAN_PLACE_COUNT];
    int64_t *live_cat[PLAN_PLACE_COUNT];
    int64_t peak[PLAN_PLACE_COUNT];     // max over the step of live[place]
    int32_t peak_at[PLAN_PLACE_COUNT];  // the first op where it is reached
    int64_t at_peak[PLAN_PLACE_COUNT][MEM_CAT_COUNT];  // by category at that op
    int64_t max_cat[PLAN_PLACE_COUNT][MEM_CAT_COUNT];  // each category's own max over the step
    int64_t param_dtype[PLAN_PLACE_COUNT][PLAN_DT_COUNT];  // model state's params (16-bit and fp32) by place, dtype
    int64_t param_count;          // param elements (meta "params")
    int64_t frozen_count;         // of them frozen (meta "frozen_params")
    /* Model state as ZeRO counts it, per rank: [c] for the five categories MEM_PARAMS16 ..
     * MEM_OPT_STATE (report_state_category), 0 for every other; each copy of a param once
     * (report/memstate.c). In the device space, and in the host space (offload). */
    int64_t state[MEM_CAT_COUNT];
    int64_t host_state[MEM_CAT_COUNT];
    int has_per_use_gathers;      // the plan gathers some params per use (fsdp): MEM_GATHERED
    unsigned cat_dtypes[MEM_CAT_COUNT];  // bit d: the category holds buffers of dtype d
    MemTensor top[MEM_TOP_N];     // the largest device buffers live at the device peak
    int n_top, n_live_at_peak;
    uint8_t *cat;                 // [n_tensors] category of each tensor (views: the root's)
    int32_t *root;                // [n_tensors] root tensor of each
    int32_t *copy_of;             // [n_tensors] roots that copy a param: the param (its storage,
                                  // or the view a cast reads); PLAN_NONE for every other tensor
    uint8_t *marks;               // [n_tensors] MEM_MARK_* of each root (report/memstate.c)
    int64_t *saved_by_block;      // [n_blocks + 1] saved bytes read by each block's
                                  // backward; the last entry: by ops outside blocks
    int32_t *block_ops;           // [n_blocks + 1] ops of each block in this program (a
                                  // stage holds some of the plan's blocks); the last: outside
    int shard_applied;            // the plan communicates (has collectives)
    int64_t cuda_workspace;       // CUDA ranks only, outside the arena: the cuBLAS workspace
                                  // (meta "cuda_workspace_bytes"); 0 when the plan has no CUDA program
} MemReport;

/* The report of a plan that passed plan_check. NULL with a message when the plan has no
 * memory plan (meta "arena_bytes") or memory runs out. Free with report_mem_free. */
MemReport *report_mem_new(const Plan *p, char *err, size_t errlen);
/* The report of program k of p, extracted alone (plan_extract_program; it is the report's
 * own) when p has several, or of p itself when it has one. */
MemReport *report_mem_new_stage(const Plan *p, int32_t k, char *err, size_t errlen);
void report_mem_free(MemReport *r);
const char *report_category_name(MemCategory c);  // "saved for backward"
const char *report_category_key(MemCategory c);   // "saved" (JSON keys, CSS classes)
/* The root buffers live at op i (device or host), largest first, ties by id: at most
 * max of them into out; returns how many there are in all. */
int report_live_at(const MemReport *r, int32_t op, PlanPlace place, int transient_only, MemTensor *out, int max);

/* The last block of the run starting at block b: consecutive blocks of one layer whose
 * backward reads the same saved bytes (printed as one line), all held by the program or
 * (another stage's) none. */
int32_t report_block_run(const MemReport *r, int32_t b);

/* ---- report/memstate.c: model state as ZeRO counts it (for memreport.c) ------------- */

/* Root t's bytes, capped so that a sum over every tensor fits in an int64 (a plan from a
 * file is not trusted). */
int64_t report_buffer_bytes(const Plan *p, int32_t t);

enum {
    MEM_MARK_PER_USE = 1,  // one of several gathers of the same params (fsdp's, per block and pass)
    MEM_MARK_GRAD16 = 2,   // a 16-bit gradient a cast makes an fp32 one of (unsharded plans)
    MEM_MARK_BUCKET = 4,   // the full gradient a reduce-scatter reads: its working buffer
    MEM_MARK_SENT = 8,     // a gradient copied to the host (offload) or sent to another stage:
                           // counted where it arrives
    MEM_MARK_PARTIAL = 16, // a partial sum of a gradient (accumulation): the sum is counted
};

/* Whether c is one of ZeRO's model-state categories (MEM_PARAMS16 .. MEM_OPT_STATE). */
int report_state_category(MemCategory c);
/* The sum of a space's model state (r->state or r->host_state). */
int64_t report_state_sum(const int64_t *state);
/* r->copy_of and r->marks of every root (r->root is found). 0, or -1 when out of memory. */
int report_state_marks(MemReport *r);
/* Root t's category by its role, dtype and marks; MEM_ACTS for every activation (the
 * caller tells saved and recompute ones apart). */
MemCategory report_category_of(const MemReport *r, int32_t t);
/* r->state, r->host_state, r->param_dtype and r->has_per_use_gathers from the categories
 * (r->cat). 0, or -1 when out of memory. */
int report_state_totals(MemReport *r);

/* ---- report/memfmt.c: sizes and names, for every output ----------------------------- */

/* 1536 -> "1.5 KiB"; 0 -> "0 B". */
const char *report_bytes(int64_t bytes, char *buf, size_t n);
/* Bytes per param: "2.00", "0.50", and below 0.1 three significant digits ("0.00195"),
 * so that every category of a plan sharded over many ranks shows. */
const char *report_per_param(double v, char *buf, size_t n);
/* a * b for sizes, INT64_MAX when it would overflow (plans from files are not trusted). */
int64_t report_mul_sat(int64_t a, int64_t b);
/* 1234567 -> "1,234,567" */
const char *report_grouped(int64_t v, char *buf, size_t n);
/* "80GiB", "1.5 TB", "512MiB": 0, or -1 with a message naming the accepted units. */
int report_size_parse(const char *s, int64_t *bytes, char *err, size_t errlen);
/* s with control and non-ASCII bytes as '?', cut to 48 characters with "...". */
const char *report_clean(const char *s, char *buf, size_t n);
/* A tensor's name (control bytes replaced, long names cut) or "%id". */
const char *report_tensor_name(const Plan *p, int32_t id, char *buf, size_t n);
/* "f32[8, 1024, 768]" */
const char *report_type(const PlanTensor *t, char *buf, size_t n);
/* "matmul (backward) gpt2.fsm:27:47, block h.3" for an op; what made a tensor:
 * its producer that way, or its role ("param") when no op makes it. */
const char *report_op_where(const Plan *p, int32_t op, char *buf, size_t n);
const char *report_made_by(const Plan *p, int32_t tensor, char *buf, size_t n);
/* "rank 0" or "ranks 0-7": the ranks of the report's stage ("ranks 8-15" for stage 1 of
 * a plan of 8 data-parallel ranks per stage). */
const char *report_ranks(const MemReport *r, char *buf, size_t n);
/* What a report is of: its ranks for a plan of one program, "stage 1 of 2 (ranks 8-15)"
 * for a stage of a plan of several. */
const char *report_label(const MemReport *r, char *buf, size_t n);
/* The ranks of program k: "rank 3", "ranks 8-15". */
const char *report_stage_ranks(const Plan *p, int32_t k, char *buf, size_t n);
/* The same from the plan: program k's label ("stage 1 of 2 (ranks 8-15)"; "ranks 0-7"
 * when the plan has one program). */
const char *report_stage_label(const Plan *p, int32_t k, char *buf, size_t n);

/* ---- report/stages.c: the memory report of every stage --------------------------- */

/* One memory report per program, in stage order. A plan of one program has exactly the
 * report report_mem_new makes, and every output of it is that report's. */
typedef struct {
    const Plan *plan;
    int32_t n;            // stages: the plan's programs
    MemReport **stage;    // [n]
    int32_t largest;      // the stage with the largest device arena (the first of equals):
                          // the one --mem-limit checks
} MemStages;

/* The reports of a plan that passed plan_check; NULL with a message as report_mem_new. */
MemStages *report_stages_new(const Plan *p, char *err, size_t errlen);
void report_stages_free(MemStages *s);
/* The report of the stage with the largest device arena. */
const MemReport *report_stages_largest(const MemStages *s);

/* ---- report/memtext.c: the text report (fsc --mem, fsexec --inspect) --------------- */

void report_mem_print(const MemReport *r, FILE *out);
/* One program: report_mem_print. Several: a table of the stages, then each one's report. */
void report_stages_print(const MemStages *s, FILE *out);
/* The reports of the plan's forward-only programs (Plan.eval, Plan.sample), each under a
 * title of its own; nothing when it has none. */
void report_forward_print(const Plan *p, FILE *out);

/* ---- report/memjson.c: the same as JSON (fsc --mem=json) --------------------------- */

/* 0, or -1 when out of memory or the write fails. */
int report_mem_json(const MemReport *r, FILE *out);
/* One program: report_mem_json's object. Several: {"model", "world", "dp_world",
 * "n_stages", "largest_stage", "stages": [each stage's object, with "stage"]}. */
int report_stages_json(const MemStages *s, FILE *out);

/* ---- report/memhtml.c: one self-contained page with an SVG timeline (--mem=html) ---- */

int report_mem_html(const MemReport *r, FILE *out);
/* One program: report_mem_html's page. Several: the stages' table, the schedule as a
 * lane per stage (report/timesvg.c), then one section per stage. */
int report_stages_html(const MemStages *s, FILE *out);
/* The same with another plan's reports overlaid on each chart (fsc --mem=html FILE
 * --compare OTHER.plan): its stage of the same number, or (stage counts differ) its
 * largest; other_name labels it. other NULL: report_stages_html. */
int report_stages_html_compare(const MemStages *s, const MemStages *other, const char *other_name, FILE *out);

/* ---- report/memlimit.c: --mem-limit ------------------------------------------------ */

/* A setting that would change the plan, and the arena it gives (compiled by the caller). */
typedef struct {
    char flags[96];     // as typed on the command line: "-D B=4", "--recompute Block"
    char what[96];      // what it does: "half the batch (8 -> 4 sequences)"
    int64_t arena;      // the arena with it; -1 when it did not compile
    int changes_training;  // 1: trains differently (a smaller batch): offered after every
                           // setting that trains the same, whatever their arenas
} MemWhatIf;

/* Whether the device arena passes limit bytes. */
int report_over_limit(const MemReport *r, int64_t limit);
/* The error of a plan over the limit: by how much, what is live at the peak, and the
 * settings tried with the saving each gives. */
void report_limit_print(const MemReport *r, int64_t limit, const MemWhatIf *w, int n, FILE *out);

/* ---- report/comm.c: what a plan sends -------------------------------------------------- */

typedef struct {
    int64_t world;      // the data-parallel ranks of the stage
    int collectives;    // per step
    double bytes;       // per rank and step, ZeRO's accounting (all-reduce 2 Psi, others Psi)
    double ring_bytes;  // what a ring algorithm sends: (group - 1) / group of bytes
    int sends, recvs;   // point-to-point ops per step (pipeline stages)
    double send_bytes, recv_bytes;  // their bytes, per rank and step
    int copies;         // copies between the device and the host (offload), per step
    double to_host_bytes, to_device_bytes;  // their bytes, per rank and step
    /* Hybrid sharding (shard_group S < world): the payload within the shard groups (their
     * gathers and reduce-scatters) and across them (the replica groups' all-reduces of
     * the gradient shards), and what a ring sends of the latter; M, the bytes of the
     * gradients reduced across the groups (every shard of them: S x the shards'). Across
     * hosts, when a shard group is a host's S GPUs, a ring sends 2 M (W - S) / (S W) of M
     * (W the stage's ranks): the across ring bytes. Zero without hybrid groups. */
    int64_t shard;      // S: the ranks a shard is split over (plan_shard_group)
    double within_bytes, across_bytes, across_ring_bytes, across_grad_bytes;
} CommTotals;

/* Program 0's, which is every rank's in a plan of one program (and a plan without
 * programs: every op, over meta "world"). */
CommTotals comm_totals(const Plan *p);
/* Program k's: the ops each of its ranks runs. */
CommTotals comm_totals_stage(const Plan *p, int32_t k);
/* Every collective of a step with its bytes, then the totals (fsc --comm, --inspect); a
 * plan of several programs: per stage, with its point-to-point bytes by peer. */
void comm_report(const Plan *p, FILE *out);
/* What op moves per rank and step, as CommTotals counts it: a collective's ring bytes
 * over its group (from a stage of dp_world ranks), a send's or receive's bytes, a copy's
 * bytes; 0 for every other op. */
double comm_op_bytes(const Plan *p, const PlanOp *op, int64_t dp_world);

/* ---- report/planop.c: what the reports read of an op ------------------------------ */

/* Integer attribute `key` of op (an int, or a float rounded), or def. */
int64_t report_op_int(const Plan *p, const PlanOp *op, const char *key, int64_t def);
/* What the op moves (ops.def's comm column): COMM_NONE for an op that moves nothing, or
 * one without the tensors its kind needs (a hostile plan). */
OpComm report_op_comm(const Plan *p, const PlanOp *op);
/* The ranks of a collective's group: its stage's data-parallel ranks (group 0), one per
 * stage (group 1, the pipeline group), or its world (hybrid sharding's shard group, 2,
 * and replica group, 3). */
int64_t report_group_size(const Plan *p, const PlanOp *op, int64_t dp_world);

/* ---- report/timeline.c: the step's schedule on a logical clock (fsc --timeline) ---- */

/* A task: a run of consecutive ops of one program (a stage) that the timeline schedules
 * as one: a micro-batch's forward or backward, or the step's own work (the optimizer,
 * gradient reductions: ops of no micro-batch). Later schedules add kinds and fields, not
 * a new model: zero-bubble splits a weight-gradient kind off the backward; interleaved
 * schedules give each task its model chunk. */
/* A task's kind: a micro-batch's forward, its backward (with the zero-bubble schedule:
 * the inputs' gradients only), its params' gradients (zero-bubble: W), the step's work. */
typedef enum { TL_FORWARD, TL_BACKWARD, TL_STEP, TL_WEIGHT, TL_KIND_COUNT } TlKind;
/* How a task's time is counted: its ops' FLOPs at the nominal REPORT_TL_RATE, in ms; or
 * unit costs (a forward 1, a backward 2, the step's work 0), as schedules are analysed. */
typedef enum { TL_COST_FLOPS, TL_COST_UNIT } TlCost;
#define REPORT_TL_RATE 1e12  // FLOP/s: one nominal accelerator, so that times read as ms

typedef struct {
    TlKind kind;
    int32_t stage;
    int32_t microbatch;        // PLAN_NONE for the step's work
    int32_t chunk;             // the model chunk on its stage; 0 (one per stage) for now
    int32_t first_op, n_ops;   // plan op ids: a range of its stage's program
    double flops;
    double cost;               // time: ms (TL_COST_FLOPS) or units
    double start, end;         // on the step's clock, from 0: from when its first op that
                               // takes time starts (waits at its receives before are idle);
                               // longer than cost when it waits inside (a pipeline collective)
    int32_t first_dep, n_deps; // range in Timeline.deps: the tasks (on other stages) that
                               // hold the sends of its receives
} TlTask;

typedef struct {
    int32_t first_task, n_tasks;  // range in Timeline.tasks, in program order
    double busy, idle;            // idle: the makespan less busy (the stage's bubble)
} TlStage;

typedef struct {
    const Plan *plan;
    TlCost cost;
    int fell_back;             // TL_COST_FLOPS was asked of a plan without FLOPs: units
    int split_backward;        // the plan has weight-gradient tasks (zero-bubble): unit B = 1
    TlTask *tasks;
    int32_t n_tasks;
    int32_t *deps;
    int32_t n_deps;
    TlStage *stages;           // one per program
    int32_t n_stages, n_microbatches;
    double makespan;           // when the last task ends
    double ideal;              // the busiest stage's work alone (no bubble)
    double bubble;             // 1 - ideal / makespan; 0 for an empty step
} Timeline;

/* The schedule of a plan that passed plan_check: each stage runs its tasks one at a time
 * in program order, op by op; a receive waits until the matching send is done (the k-th
 * send from a to b meets the k-th receive on b from a), so a task that holds a receive
 * starts no earlier than the end of the peer's task that holds the send; a collective
 * over the pipeline group ends on every stage together; transfers take no time. NULL
 * with a message when out of memory, a send or receive has no partner, the stages run
 * different numbers of pipeline collectives, or they wait on each other (a deadlock:
 * which stages, at which ops, for what). */
Timeline *report_timeline_new(const Plan *p, TlCost cost, char *err, size_t errlen);
void report_timeline_free(Timeline *t);
/* "F3", "B0", "step" (later chunks: "F3.1"). */
const char *report_task_label(const TlTask *t, char *buf, size_t n);
/* Where a task's box begins in a lane: its time's worth before its end, so that a task
 * that waits inside (a pipeline collective) shows its wait as idle, not as work. */
double report_task_drawn_from(const TlTask *t);
/* A time in the timeline's unit: "15" (units), "12.345 ms", "0.00162 ms". */
const char *report_tl_time(const Timeline *t, double v, char *buf, size_t n);
/* The text of fsc --timeline: a lane per stage about 100 columns wide, each stage's busy
 * and idle time, the makespan, the ideal and the bubble. */
void report_timeline_print(const Timeline *t, FILE *out);

/* ---- report/kernels.c: what each launch of the CUDA program should cost (fsc --kernels) */

/* The GPU a launch is priced on (fsc fills it from the planner's machine): rates per GPU. */
typedef struct {
    char name[64];
    double flops_16bit;   // FLOP/s of bf16 / fp16 GEMMs on tensor cores (dense)
    double flops_fp32;    // FLOP/s on the FMA units: every LAUNCH, f32 GEMMs
    double hbm_bw;        // bytes/s of device memory
    double flops_tf32;    // FLOP/s of f32 products on TF32 tensor cores (dense): a tf32 plan's
} KernGpu;

/* What keeps a GEMM off cuBLAS's fast tensor-core kernels, which load 16 bytes at a time
 * (KernLaunch.misaligned: a bit each): a leading dimension or batch stride (batch > 1) whose
 * bytes (elements x its operand's element size) are not a multiple of 16, or an operand
 * that starts off a 16-byte boundary (its tensor's arena offset, plus the instruction's
 * element offset, plus rank x its rank stride; cudaMalloc's base is 256-byte aligned). */
typedef enum {
    KERN_LDA, KERN_LDB, KERN_LDC, KERN_STRIDE_A, KERN_STRIDE_B, KERN_STRIDE_C,
    KERN_OFF_A, KERN_OFF_B, KERN_OFF_C, KERN_OFF_BIAS, KERN_OFF_AUX, KERN_OFF_R, KERN_ALIGN_COUNT
} KernAlign;

/* One instruction of the CUDA program (plan/plan.h: PlanCuda) and its roofline. */
typedef struct {
    int32_t index;        // in Plan.cuda
    int32_t op;           // the plan op it runs for; its name is the op kind
    double flops;         // FLOPs it does (report/kernels.c says how an op's are split)
    int tensor_core;      // its FLOPs run on tensor cores (a GEMM of 16-bit inputs, a "_tc_" kernel)
    int tf32;             // ... as TF32 (f32 inputs in a plan compiled with tf32), at flops_tf32
    double bytes_read, bytes_written;  // DRAM bytes, from its arguments' sizes
    int64_t elements;     // the work: elements of its largest argument
    double seconds;       // roofline: max(flops / rate, bytes / hbm_bw)
    unsigned misaligned;  // a GEMM's failed rules, bit (1u << KernAlign) each; 0: aligned (or a LAUNCH)
} KernLaunch;

/* The instructions of one op kind ("layernorm_bwd"), summed. */
typedef struct {
    const char *op;       // the op's name (the plan's string)
    int32_t instructions, launches, gemms;
    double flops, tc_flops, bytes_read, bytes_written, seconds;
} KernKind;

typedef struct {
    const Plan *plan;
    int32_t program;      // the program (pipeline stage) of the report
    KernGpu gpu;
    KernLaunch *launch;   // its instructions, in program order
    int32_t n_launch, n_launches, n_gemms;
    int32_t n_misaligned;         // GEMMs with a KernLaunch.misaligned bit
    double misaligned_seconds;    // their roofline (no penalty added: nothing measured one)
    KernKind *kind;       // by roofline time, the longest first (ties: by name)
    int32_t n_kind;
    double flops, tc_flops, bytes_read, bytes_written, seconds;  // the whole step's
} KernReport;

/* The report of program k of a plan that passed plan_check. NULL with a message when the
 * plan has no CUDA program or memory runs out. Free with report_kernels_free. */
KernReport *report_kernels_new(const Plan *p, int32_t k, const KernGpu *gpu, char *err, size_t errlen);
void report_kernels_free(KernReport *r);
/* A rule's name in JSON: "lda", "stride_b", "offset_c", "offset_bias", ... */
const char *report_align_name(KernAlign rule);
/* GEMM instruction i's failed rules (bits of `bad`) for a person: "ldb 4 x 2 B, ldc 4 x 2 B,
 * offset of B". */
const char *report_align_describe(const Plan *p, int32_t i, unsigned bad, char *buf, size_t n);

/* ---- report/kernelout.c: the kernel report as text and JSON (fsc --kernels[=json]) --- */

/* Every launch, then the sums by op kind and the step's; a heading per stage when the
 * plan has several programs. 0, or -1 with a message. */
int report_kernels_print(const Plan *p, const KernGpu *gpu, FILE *out, char *err, size_t errlen);
/* The same as one JSON object (report/kernelout.c describes it). */
int report_kernels_json(const Plan *p, const KernGpu *gpu, FILE *out, char *err, size_t errlen);

#endif
