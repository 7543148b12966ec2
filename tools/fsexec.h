/* tools/fsexec.h: what fsexec's files share (not a layer's header: only tools/fsexec*.c
 * include it). The parsed command line (Flags), the state of one run (Run), who this
 * process is in messages, and each file's entry points, grouped by the file that defines
 * them. Invariants: Flags is filled once by parse_args and read-only after; `who`,
 * `my_rank`, `my_world` and `layout` are set by join_world (fsexec_world.c) before any
 * rank-dependent message, and keep their one-process values until then.
 */
#ifndef FS_FSEXEC_H
#define FS_FSEXEC_H

#include <stdint.h>

#include "runtime.h"

/* The command line, as parse_args leaves it (0 and NULL: not given, unless said). */
typedef struct {
    const char *plan, *inspect, *data, *log, *save_weights, *load_weights, *save_grads;
    const char *checkpoint_dir, *resume, *export_from;  // --export: from this checkpoint to `plan` (the output)
    int64_t save_every, keep;
    int64_t steps;
    uint64_t seed;
    int has_seed, threads, log_every, debug_nan, debug_guard, sync_sends, one_by_one;
    int resume_partial, resume_other_data;  // --resume-partial, --resume-other-data
    int device, cuda_graph, tf32;  // device: RtDeviceKind
    RtDataOrder order;
    RtTokenFormat data_format;  // --data-format (0: auto)
    RtWeightsFormat load_format, save_format;  // --weights-format (0: fsexec)
    const char *weights_format;
    int64_t nproc, timeout;  // --nproc (0: not given), --timeout seconds
    int64_t overflow_at;     // --debug-overflow-at: the step whose fp16 gradients overflow
    const char *val_data;    // --val-data
    int64_t eval_every, eval_batches;
    int64_t sample, top_k;   // --sample N (0: train), --top-k (0: all)
    int no_kv_cache;         // --no-kv-cache: sample with the window program
    const char *prompt, *prompt_ids, *tokenizer;
    double temperature;
    const char *trace;       // --trace FILE
    int64_t trace_first, trace_last;  // --trace-steps A:B (0: the default)
    int predict;             // --predict: write the outputs for --data's samples to --out
    const char *out;         // --out FILE.npy
} Flags;

/* One run of a plan on this rank: what run_plan opens, run_free closes. */
typedef struct {
    Exec *e;               // runs the steps on the CPU, or is the device's host mirror
    RtData *data;
    Progress *progress;
    RtDevice dev;          // the backend that runs the steps (the CPU's or a device's)
    RtCheckpoint *resume;  // --resume's checkpoint, opened and checked before the run
    RtEval *eval;          // --val-data's evaluation program, or NULL
    int64_t ck_bytes;      // a checkpoint's size (rt_checkpoint_size), checked free before each save
} Run;

/* tools/fsexec.c */
/* Who speaks in messages: "fsexec", or "[rank r] fsexec" (see its definition). */
extern char who[80];
extern int my_rank, my_world;
extern RtLayout layout;  // the plan's stages x data-parallel ranks
/* A local error: with several ranks it ends them all; alone, returns rc. */
int local_error(int rc);
/* `fsexec: ` fmt with arg ` (see fsexec --help)`; 2. */
int usage_error(const char *fmt, const char *arg);
/* plan_read, with its error said; NULL after a message. */
Plan *load(const char *path);

/* tools/fsexec_args.c */
/* argv into f, every flag checked; 0, or the exit status after a message (-h, -V exit 0). */
int parse_args(int argc, char **argv, Flags *f);
/* The files the run writes: writable, none an input; 0, or 1 after a message. */
int check_outputs(const Flags *f);

/* tools/fsexec_report.c */
/* Ends the progress display (its summary line) once; 0, or 1 after a message. */
int end_progress(Run *r);
/* The start line, by the reporting rank; p is the whole plan. */
void start_line(const Plan *p, const Run *r, const Flags *f, uint64_t seed);
/* A note when --steps cuts a decaying learning-rate schedule short, or outlasts it. */
void schedule_note(const Plan *p, int64_t steps);

/* tools/fsexec_world.c */
/* This rank in the plan's world (MPI started, `who` and `layout` set); 0, or an exit status. */
int join_world(const Flags *f, const Plan *p, RtRanks *rk);
/* fsexec --nproc N: the same command as N ranks under mpirun; its exit status. */
int launch(const Flags *f, int argc, char **argv);

/* tools/fsexec_run.c */
/* Whether f32 matrix products run on TF32 tensor cores: the plan's tf32 setting decides. */
int compiled_tf32(const Plan *p);
/* The plan run (trained, or --predict's outputs written); 0, or an exit status after a message. */
int run(const Flags *f);

/* tools/fsexec_sample.c */
/* fsexec PLAN --sample N: 0, or an exit status after a message. */
int sample(const Flags *f);

#endif
