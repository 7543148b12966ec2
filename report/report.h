/* report/report.h: what a plan asks of memory, for people. Computed from the plan alone
 * (plan/plan.h), so `fsc --mem` (a plan built in memory, never written) and `fsexec
 * --inspect` (a plan read from a file) print the same numbers from the same code.
 *
 * The plan is one program for every rank of a data-parallel world (meta "world"), so
 * there is one report, labelled "ranks 0-(world-1)". Every byte count is of one rank.
 *
 * Where it sits: after codegen in fsc, after plan_read in fsexec. Depends on plan/ and
 * jansson, and the op table (ops/ops.h) for what each op is. Grouped by the file that defines each declaration.
 */
#ifndef FS_REPORT_H
#define FS_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "plan.h"

/* ---- report/memreport.c: the analysis ------------------------------------------------ */

/* What each buffer of the arena is for. A view counts as its root buffer; an activation
 * is "saved" when a forward op makes it and a backward (or recompute) op reads it. */
typedef enum {
    MEM_PARAMS, MEM_GATHERED, MEM_GRADS, MEM_OPT_STATE, MEM_MASTER, MEM_INPUTS, MEM_SAVED,
    MEM_RECOMPUTE, MEM_ACTS, MEM_COMM, MEM_SCRATCH, MEM_CONSTS, MEM_CAT_COUNT
} MemCategory;

enum { MEM_TOP_N = 10 };

/* A buffer live at the peak. */
typedef struct {
    int32_t tensor;      // root tensor id
    int64_t bytes;
    MemCategory cat;
} MemTensor;

typedef struct MemReport {
    const Plan *plan;
    int64_t world;                // data-parallel ranks that run this program
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
    int64_t param_dtype[PLAN_DT_COUNT];  // bytes of param buffers by dtype (both places)
    int64_t param_count;          // trainable elements (meta "params")
    int64_t state[4];             // model state: params, grads, optimizer state, master
    MemTensor top[MEM_TOP_N];     // the largest device buffers live at the device peak
    int n_top, n_live_at_peak;
    uint8_t *cat;                 // [n_tensors] category of each tensor (views: the root's)
    int32_t *root;                // [n_tensors] root tensor of each
    int64_t *saved_by_block;      // [n_blocks + 1] saved bytes read by each block's
                                  // backward; the last entry: by ops outside blocks
    int shard_applied;            // the plan communicates (has collectives)
    int64_t cuda_workspace;       // CUDA ranks only, outside the arena: the cuBLAS workspace
                                  // (meta "cuda_workspace_bytes"); 0 when the plan has no CUDA program
} MemReport;

/* The report of a plan that passed plan_check. NULL with a message when the plan has no
 * memory plan (meta "arena_bytes") or memory runs out. Free with report_mem_free. */
MemReport *report_mem_new(const Plan *p, char *err, size_t errlen);
void report_mem_free(MemReport *r);
const char *report_category_name(MemCategory c);  // "saved for backward"
const char *report_category_key(MemCategory c);   // "saved" (JSON keys, CSS classes)
/* The root buffers live at op i (device or host), largest first, ties by id: at most
 * max of them into out; returns how many there are in all. */
int report_live_at(const MemReport *r, int32_t op, PlanPlace place, int transient_only, MemTensor *out, int max);

/* The last block of the run starting at block b: consecutive blocks of one layer whose
 * backward reads the same saved bytes (printed as one line). */
int32_t report_block_run(const MemReport *r, int32_t b);

/* ---- report/memfmt.c: sizes and names, for every output ----------------------------- */

/* 1536 -> "1.5 KiB"; 0 -> "0 B". */
const char *report_bytes(int64_t bytes, char *buf, size_t n);
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
/* "rank 0" or "ranks 0-7" */
const char *report_ranks(const MemReport *r, char *buf, size_t n);

/* ---- report/memtext.c: the text report (fsc --mem, fsexec --inspect) --------------- */

void report_mem_print(const MemReport *r, FILE *out);

/* ---- report/memjson.c: the same as JSON (fsc --mem=json) --------------------------- */

/* 0, or -1 when out of memory or the write fails. */
int report_mem_json(const MemReport *r, FILE *out);

/* ---- report/memhtml.c: one self-contained page with an SVG timeline (--mem=html) ---- */

int report_mem_html(const MemReport *r, FILE *out);

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
    int64_t world;
    int collectives;    // per step
    double bytes;       // per rank and step, ZeRO's accounting (all-reduce 2 Psi, others Psi)
    double ring_bytes;  // what a ring algorithm sends: (world - 1) / world of bytes
} CommTotals;

CommTotals comm_totals(const Plan *p);
/* Every collective of a step with its bytes, then the totals (fsc --comm, --inspect). */
void comm_report(const Plan *p, FILE *out);

#endif
