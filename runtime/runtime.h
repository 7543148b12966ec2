/* runtime/runtime.h: fsexec's side of the plan. It loads a plan (plan/plan.h: checked,
 * never trusted), reports what it holds, and runs its static schedule step after step
 * on the CPU backend (runtime/cpu/) of one rank: one arena carved by the plan's offsets,
 * params from a counter-based RNG, batches from token files or synthetic data. Finding
 * ranks and the CUDA backend come later. Grouped by the file that defines each
 * declaration.
 */
#ifndef FS_RUNTIME_H
#define FS_RUNTIME_H

#include <stdint.h>
#include <stdio.h>

#include "plan.h"

/* The version of fsexec; the same as FS_VERSION in ir/ir.h (a unit test holds them
 * equal), kept here because the runtime does not depend on the compiler. */
#define RT_VERSION "0.1.0"

/* ---- runtime/inspect.c: fsexec --inspect ------------------------------------------- */

/* What a plan holds, for people: format version, model, compiler, training settings,
 * ranks, the arena, parameters (count, bytes by dtype), inputs and outputs, blocks,
 * an op histogram, tensors by role with bytes, and the section table. The plan must
 * have passed plan_check (plan_read does that). */
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
 * std a; uniform: [a, b)): element i is drawn from Philox(key = seed, counter = (i,
 * fnv1a(name))), so a slice equals the same slice of the whole tensor, whatever the
 * thread count. */
void rt_init_param(const char *name, uint64_t seed, PlanInit kind, double a, double b, int64_t first, int64_t count,
                   float *out);

/* ---- runtime/exec.c: the executor of one rank (CPU backend) -------------------------- */

typedef struct Exec Exec;

/* Formats a message into err and returns -1: `return rt_fail(err, errlen, ...)`. */
int rt_fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));


typedef struct {
    uint64_t seed;   // parameter init
    int nan_fill;    // debug: fill every buffer with NaN outside its planned live range
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

/* Allocates the arena (the plan's meta "arena_bytes", once), resolves every op to its
 * CPU kernel, binds every call, and initializes params and optimizer state from
 * o->seed; inputs start as zeros. NULL with a message ("plan uses op 'foo' that this
 * fsexec does not know; rebuild fsexec") on failure. p must outlive the Exec. */
Exec *rt_exec_new(const Plan *p, const ExecOptions *o, char *err, size_t errlen);
void rt_exec_free(Exec *e);
/* One step (1-based): writes the "step" input, then runs, in plan order, the ops whose
 * phase bit (RT_PHASE(PLAN_PHASE_FORWARD) | ...) is in `phases`. 0, or -1 for a step
 * out of range. Allocates nothing. */
int rt_exec_run(Exec *e, int64_t step, unsigned phases);
/* The same for ops [from, to) only (a step split around a point, e.g. to read the
 * gradients before the first optimizer op). */
int rt_exec_run_ops(Exec *e, int64_t step, int32_t from, int32_t to, unsigned phases);
/* The index of the first op of that phase; the op count if none. */
int32_t rt_exec_first_op(const Exec *e, PlanPhase phase);
/* The first tensor named `name`: 0, or -1 if none. */
int rt_exec_tensor(const Exec *e, const char *name, RtTensor *t);
void rt_exec_tensor_id(const Exec *e, int32_t id, RtTensor *t);
const Plan *rt_exec_plan(const Exec *e);
int64_t rt_exec_arena_bytes(const Exec *e);
const void *rt_exec_arena(const Exec *e);
/* Threads for OpenMP loops and OpenBLAS; n < 1 leaves the defaults. */
void rt_set_threads(int n);
int rt_threads(void);

/* ---- runtime/data.c: batches for the inputs ------------------------------------------ */

typedef enum { RT_DATA_NONE, RT_DATA_LM, RT_DATA_CLASSES } RtDataKind;
typedef enum { RT_ORDER_RANDOM, RT_ORDER_SEQUENTIAL } RtDataOrder;
typedef enum { RT_TOKENS_LLMC, RT_TOKENS_RAW } RtTokenFormat;

#define RT_DATA_KEY 0xDA7Au  // xored into the seed for batch randomness

typedef struct {
    const uint16_t *tok;
    int64_t n;
    RtTokenFormat format;
} RtTokens;

typedef struct RtData RtData;

/* A token file in memory: llm.c's (256 int32 header: magic 20240520, version 1, count;
 * then uint16 tokens) or, any other even size, raw uint16. Points into buf. 0, or -1 with
 * a message (bad version, count or size of an llm.c file; an odd size; no tokens). */
int rt_tokens_parse(const void *buf, size_t len, RtTokens *out, char *err, size_t errlen);
/* 0 if every token is < vocab; else -1 naming the first one that is not. */
int rt_tokens_check(const RtTokens *t, int64_t vocab, char *err, size_t errlen);
/* Where window b of a step starts (see data.c); n_tok >= T + 2. */
int64_t rt_lm_window_start(RtDataOrder order, uint64_t seed, int64_t step, int64_t B, int64_t b, int64_t T,
                           int64_t n_tok);
/* B windows of T + 1 tokens: tokens [B, T] and targets [B, T] (the same, one later). */
void rt_lm_batch(const RtTokens *t, RtDataOrder order, uint64_t seed, int64_t step, int64_t B, int64_t T,
                 int32_t *tokens, int32_t *targets);
/* Class centers [K, D] ~ N(0, 1), fixed by the seed. K: the last dim of the logits (see
 * rt_plan_logits; else of the labels' cross-entropy input; else 2). */
void rt_blob_centers(uint64_t seed, int64_t K, int64_t D, float *centers);
/* Labels y [B] uniform in [0, K), features x [B, D] = centers[y] + 0.5 * N(0, 1). */
void rt_blobs_batch(const float *centers, uint64_t seed, int64_t step, int64_t B, int64_t D, int64_t K, float *x,
                    int32_t *y);
/* The two data inputs (every input but "step"), in tensor order: tokens and targets, or
 * features and labels. 0, or -1 when the plan has not exactly two. */
int rt_data_inputs(const Plan *p, int32_t *a, int32_t *b);
/* Which kind of data a plan's inputs take (RT_DATA_NONE: neither). */
RtDataKind rt_data_kind(const Plan *p);
/* A classifier's logits [B, K]: the output named "logits", else the input of the
 * cross-entropy that the labels feed when it is an output; PLAN_NONE if neither. */
int32_t rt_plan_logits(const Plan *p);
/* The vocab tokens must stay below: meta "vocab", else the rows of the embedding table
 * the tokens index and the classes of the cross-entropy the targets feed, else 65536. */
int64_t rt_plan_vocab(const Plan *p);
/* The data source for e's plan: the token file `path` (NULL: the built-in corpus) for a
 * language model, Gaussian blobs for a classifier (path must be NULL). Checks every
 * token against the vocab. NULL with a message on failure. */
RtData *rt_data_open(Exec *e, const char *path, RtDataOrder order, uint64_t seed, char *err, size_t errlen);
/* Writes step's batch into the plan's inputs. Allocates nothing. */
void rt_data_fill(RtData *d, int64_t step);
RtDataKind rt_data_get_kind(const RtData *d);
const char *rt_data_describe(const RtData *d);  // for the start line
int64_t rt_data_items(const RtData *d);         // tokens (LM) or samples per step
void rt_data_close(RtData *d);

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
/* Fills each t[i].data from the file after checking the whole file: every header field,
 * the offsets, and that the file holds exactly these names with these dtypes and shapes.
 * On any error nothing is written and -1 comes back with a message. */
int rt_st_read(const char *path, const StEntry *t, int32_t n, char *err, size_t errlen);
/* Every param (tied ones once), under its name. */
int rt_save_weights(const Exec *e, const char *path, int64_t step, char *err, size_t errlen);
/* Every param's gradient ("<param>.grad"), under the param's name; call between
 * backward and the first optimizer op. */
int rt_save_grads(const Exec *e, const char *path, int64_t step, char *err, size_t errlen);
int rt_load_weights(Exec *e, const char *path, char *err, size_t errlen);

/* ---- runtime/progress.c: per-step reporting ------------------------------------------ */

typedef struct Progress Progress;

typedef struct {
    int64_t steps;         // the run's length
    int log_every;         // plain lines every N steps; <= 0: 1 up to 100 steps, else 10
    const char *log_path;  // JSON lines, one per step; NULL for none
    const char *unit;      // "tok" or "samples" (default "tok")
    int tty;               // -1: ask isatty(out); 0/1 force plain lines / the bar
    FILE *out;             // NULL: stderr
} ProgressOptions;

typedef struct {
    int64_t step;
    double loss, lr, grad_norm;
    double ms;             // this step's wall time
    double items;          // tokens (or samples) in this step
    double accuracy;       // NAN when the model has none
} StepStats;

Progress *rt_progress_new(const ProgressOptions *o, char *err, size_t errlen);
/* Reports one step; -1 with a message if the log cannot be written. */
int rt_progress_step(Progress *p, const StepStats *s, char *err, size_t errlen);
/* Ends the bar, prints the average rate, closes the log. */
int rt_progress_end(Progress *p, char *err, size_t errlen);
/* mean(argmax(logits[b]) == y[b]) over B rows of K. */
double rt_accuracy(const float *logits, const int32_t *y, int64_t B, int64_t K);
/* Monotonic seconds. */
double rt_now(void);

#endif
