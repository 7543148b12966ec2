/* planner/planner.h: fsc --fit, the auto-planner. Given a model, a world and a memory
 * budget per rank, it searches the training settings (shard strategy, recompute,
 * precision, reduce dtype, offload, stages, balance, micro-batches, schedule,
 * reshard_after_forward) for the fastest plan that fits: each candidate it compiles
 * runs the whole compiler (frontend, every pass through memplan, the plan without its
 * CUDA program), its device arena is read from the memory report (report/), and its
 * step time is modelled from the plan's FLOPs, bytes, streams and timeline against a
 * machine description. The global batch (the model's batch dim) never changes.
 *
 * Where it sits: beside tools/fsc.c, above frontend, passes, codegen and report; fsc
 * then compiles the winner's settings as if typed on the command line, so the plan it
 * writes is the plan of the command line it prints. Grouped by the file that defines
 * each declaration; docs/planner.md has the formulas and the pruning.
 */
#ifndef FS_PLANNER_H
#define FS_PLANNER_H

#include <stdint.h>
#include <stdio.h>

#include "frontend.h"
#include "plan.h"

/* ---- planner/machine.c: what the cost model prices against ------------------------ */

/* Rates are per GPU; bandwidths in bytes/s one way. The JSON keys are the field names. */
typedef struct {
    char name[64];
    int gpus_per_node;          // ranks of one node: collectives within it go over NVLink
    double flops_fp32;          // FLOP/s of fp32 ops (no tensor cores)
    double flops_16bit;         // FLOP/s of bf16 / fp16 ops (tensor cores, dense)
    double flops_tf32;          // FLOP/s of f32 products on TF32 tensor cores (dense); a file's default: 16-bit / 2
    double hbm_bw;              // device memory
    double nvlink_bw;           // GPU to GPU within a node
    double ib_bw;               // GPU to GPU across nodes (each GPU's NIC)
    double pcie_bw;             // device to host and back (offload's copies)
    double host_flops;          // this GPU's share of the host's FLOP/s (offloaded update)
    double host_bw;             // this GPU's share of host memory bandwidth
    double collective_latency;  // seconds each collective and point-to-point op adds
} Machine;

/* An H100 SXM node of 8 GPUs (the numbers are in machine.c and docs/planner.md). */
void machine_default(Machine *m);
/* Every key of the default, from a JSON object in path; 0, or -1 with a message naming
 * the file and the key (bad JSON, an unknown key, a missing key, a value out of range). */
int machine_load(Machine *m, const char *path, char *err, size_t errlen);
/* The machine --machine names: NULL or "h100" the default, "h200" an H200 SXM node (the
 * same but HBM3e at 4.8 TB/s), anything else a JSON file for machine_load. 0, or -1 with
 * machine_load's message. */
int machine_select(Machine *m, const char *what, char *err, size_t errlen);
void machine_print(const Machine *m, FILE *out);

/* ---- planner/space.c: the axes searched and their candidate values --------------- */

/* One axis per setting key as config_set takes it. The order is the table's order. */
typedef enum {
    AX_SHARD, AX_SHARD_GROUP, AX_RESHARD, AX_RESHARD_ROOT, AX_PRECISION, AX_REDUCE, AX_OFFLOAD, AX_RECOMPUTE,
    AX_SELECTIVE,
    AX_STAGES, AX_MICROBATCHES, AX_SCHEDULE, AX_BALANCE, AX_COUNT
} AxisId;

enum { AX_MAX_VALUES = 48, AX_VALUE_LEN = 256 };

typedef struct {
    const char *key;                 // the setting: "shard"
    int pinned;                      // given on the command line: its one value is the user's
    int n;
    char value[AX_MAX_VALUES][AX_VALUE_LEN];  // as config_set reads it
    int64_t num[AX_MAX_VALUES];      // what a value means in numbers: stages, micro-batches,
                                     // recomputed blocks; 0 for the others
} Axis;

/* What one compile of the model tells the search before it compiles candidates. */
typedef struct {
    int64_t params;       // trainable param elements (tied counted once)
    int64_t batch;        // the global batch: the model's batch dim
    /* The cost model's time of the forward and backward ops of the global batch on one
     * rank (no recompute), [0] in fp32, [1] as if 16-bit (half the bytes, the 16-bit
     * rate); and of each block's forward ops: what a recompute of it adds at least. */
    double step_time[2];
    double block_time[2][1024];
    /* Of those, each block's forward and backward ops (a pipeline stage holds whole
     * blocks), and the ops outside blocks that a pipeline puts on its last stage (the
     * head and the loss, both ways). */
    double block_step[2][1024], last_time[2];
    int n_blocks;
    int checkpoint;       // PipeCheckpoint of the model's train block (pipelines' recompute)
    char stem[64];        // the blocks are stem0, stem1, ... ("h."): recompute names ranges of
                          // them; "" when they are not so named (only none and all then)
    int attention;        // a block has an attention op: selective recompute applies
    int gpus_per_node;    // the machine's: hybrid sharding's groups are tried at its size
} ModelFacts;

typedef struct {
    Axis axes[AX_COUNT];
    int world;
    ModelFacts facts;
    int chunks_pinned;   // --chunks given: interleaved candidates do not set it
    char even[AX_MAX_VALUES][AX_VALUE_LEN];  // balance "even" for stages value i: "3,3,2"
    char recompute[AX_MAX_VALUES][2][AX_VALUE_LEN];  // the recompute setting of recompute value i
                                                     // and selective value j: "h.0-5,attention:h.6-11"
} Space;

/* A candidate: an index into each axis's values. An axis that does not apply to a
 * candidate (the schedule of one stage) holds 0 and is not set. */
typedef struct {
    uint8_t v[AX_COUNT];
} Cand;

/* The axes for a world and a model; a key in `pinned` (the command line's settings)
 * keeps that one value. 0, or -1 with a message. */
int space_build(Space *s, const ModelFacts *f, int world, const Setting *pinned, int n_pinned, char *err,
                size_t errlen);
/* The recompute setting that recomputes the first k of the model's blocks in full
 * ("none", "h.0", "h.0-5", "all"), and with `selective` the others' attention cores
 * (",attention:h.6-11"; "attention" when k is 0). */
const char *space_recompute(const ModelFacts *f, int k, int selective, char *buf, size_t n);
int space_applies(const Space *s, const Cand *c, AxisId a);
/* Whether the settings make a plan the compiler accepts (the batch splits evenly...). */
int space_valid(const Space *s, const Cand *c);
/* A candidate that the same with one value changed beats on time and memory alike
 * (fp16 against bf16: the same widths and rates and a loss scale more): never compiled. */
int space_dominated(const Space *s, const Cand *c);
/* Whether the modelled time only rises along axis a's order, the others equal (recompute,
 * selective, reshard_after_forward: each step adds ops and takes none away); the search
 * prunes by it, and tests/unit/test_planner.c checks it against brute force. */
int space_time_up(AxisId a);
const char *space_value(const Space *s, const Cand *c, AxisId a);
int64_t space_num(const Space *s, const Cand *c, AxisId a);
/* The settings of c that are not pinned and apply (plus chunks for interleaved), into
 * out (keys and values point into s); returns how many (at most AX_COUNT + 1). */
int space_settings(const Space *s, const Cand *c, Setting *out);
/* Every candidate of the product, in table order (the last axis fastest); returns how
 * many were stored into *out (malloc'd), or -1 when out of memory. */
int64_t space_enumerate(const Space *s, Cand **out);

/* ---- planner/cost.c: the modelled step time --------------------------------------- */

typedef struct {
    double time;       // the step, seconds
    double compute;    // the busiest stage's compute stream (device and host ops), busy
    double comm;       // its collectives and point-to-point, busy
    double copy;       // its host-device copies, busy
    double exposed;    // of the stage's time, what is not compute (waits on comm and copies)
    double bubble;     // the timeline's bubble (1 - ideal / makespan); 0 with one stage
} Cost;

/* The modelled time of plan p (a plan that passed the planner's compile); 0, or -1 with
 * a message (the timeline could not be made). */
int cost_plan(const Machine *m, const Plan *p, Cost *out, char *err, size_t errlen);
/* A lower bound on cost_plan's time for candidate c, from the facts alone. */
double cost_lower_bound(const Machine *m, const Space *s, const Cand *c);
/* The roofline time of one device op of `flops` FLOPs that moves `bytes`, in fp32 or a
 * 16-bit dtype: what cost_plan charges it. */
double cost_roofline(const Machine *m, double flops, double bytes, int is16);

/* ---- planner/search.c: enumeration, pruning, ranking, the front and its reasons --- */

typedef struct {
    const char *src;            // the model source
    size_t len;
    const char *path;           // its file name, for messages
    const FrontendOptions *fo;  // the command line's -D and settings
    int64_t budget;             // device bytes per rank
    int world;
    Machine machine;
    int brute;                  // compile every valid candidate (tests)
    const char *command;        // the fsc command line without --fit's flags and -o, for the
                                // winner's line; NULL: not printed
    const char *output;         // -o PLAN, or NULL
} FitRequest;

typedef struct {
    Cand cand;
    double lb;                  // cost_lower_bound
    int compiled;               // 1 compiled, -1 failed to compile, 0 not compiled
    int64_t arena, host_arena;  // device and host arenas per rank, of the largest stage
    Cost cost;
} FitPoint;

typedef struct {
    Space space;
    FitPoint *points;           // the valid candidates, in table order
    int64_t n_points;
    int64_t n_product;          // the product of the axes' sizes
    int64_t n_compiled, n_failed, n_dominated, n_time_pruned;
    int64_t winner;             // the fastest that fits, or -1
    int64_t smallest;           // the smallest arena compiled, or -1
    int64_t *front;             // Pareto front of the compiled ones, fastest first
    int n_front;
} FitResult;

/* The model's facts (one compile), then the search. 0, or -1 with a message (the model
 * does not compile, bad settings, out of memory). */
int planner_fit(const FitRequest *q, FitResult *r, char *err, size_t errlen);
void planner_free(FitResult *r);
/* The report: the space, the counts, the front with a reason per step, the winner (or,
 * when nothing fits, the smallest arena and its settings). */
void planner_report(const FitRequest *q, const FitResult *r, FILE *out);

#endif
