/* tools/fsexec_run.c: the run of a plan, once the flags are parsed: join the world
 * (fsexec_world.c), open and check --resume's checkpoint, then on this rank's stage's
 * program the Exec (a device's host mirror), the data, --val-data's evaluation, the weights
 * or the checkpoint, the device; then --predict's outputs, or the step loop
 * (runtime/step.c) with --trace, and the weights saved after it. Invariants: a check whose
 * result every rank must share (the checkpoint, its files, the saves) is agreed
 * (rt_comm_agree) before any rank goes on; any other error on one rank ends every rank
 * (local_error); a SIGINT or SIGTERM stops the run at a step boundary every rank agrees
 * on. Called by main (tools/fsexec.c).
 */
#include <inttypes.h>
#include <signal.h>
#include <string.h>

#include "fsexec.h"

/* Whether f32 matrix products run on TF32 tensor cores: the plan's tf32 setting decides (its
 * attention kernels were compiled for it; codegen/cuda_flash.c); --tf32 only repeats it. */
int compiled_tf32(const Plan *p) { return plan_meta_int(p, "tf32", 0) != 0; }

/* --tf32 on a plan compiled without tf32 would run its GEMMs on TF32 and its attention in
 * f32: a mix neither setting describes. 0, or 2 after a message. */
static int check_tf32(const Flags *f, const Plan *p)
{
    if (!f->tf32 || compiled_tf32(p)) return 0;
    fprintf(stderr, "%s: --tf32: %s was compiled with tf32 0, so its attention kernels compute in f32; compile it "
            "with --tf32 1 (fsc, or `tf32 1;` in the train block), and fsexec runs all of its f32 matrix products on "
            "TF32 tensor cores without this flag\n", who, f->plan);
    return 2;
}

/* SIGINT and SIGTERM (runtime/signals.c): the first sets this, to stop the run at the next
 * step boundary (every rank agrees on which), after a checkpoint. */
static volatile sig_atomic_t *stop_signal;

static void run_free(Run *r)
{
    end_progress(r);
    rt_checkpoint_close(r->resume);
    rt_device_close(&r->dev);
    rt_eval_free(r->eval);
    rt_data_close(r->data);
    rt_exec_free(r->e);
}

/* --trace's steps of a run of steps start+1 .. f->steps into *first, *last: 0, or 2 after
 * a message (every rank alike; rank 0 says it). */
static int trace_steps(const Flags *f, int64_t start, int64_t *first, int64_t *last)
{
    *first = f->trace_first, *last = f->trace_last;
    if (!*first) {  // the second to the fourth step: the first warms up (page faults, NVRTC, cuBLAS)
        *first = f->steps - start >= 2 ? start + 2 : start + 1;
        *last = *first + 2 < f->steps ? *first + 2 : f->steps;
    }
    const char *why = *first <= start || *last > f->steps ? "outside the run's steps"
                      : f->overflow_at >= *first && f->overflow_at <= *last ? "include --debug-overflow-at's step"
                      : f->save_grads && *first == 1 ? "include --save-grads' step 1" : NULL;
    if (!why) return 0;
    if (my_rank == 0)
        fprintf(stderr, "%s: --trace-steps %" PRId64 ":%" PRId64 " %s (this run: steps %" PRId64 " to %" PRId64
                "), which runs apart\n", who, *first, *last, why, start + 1, f->steps);
    return 2;
}

/* The step loop (runtime/step.c); 0, or 1 after a message (an error on this rank alone
 * ends every rank). */
static int train(Run *r, const Flags *f, const char *path, uint64_t seed, int64_t start, int64_t *reached,
                 int *stopped_by)
{
    int64_t first = 0, last = 0;
    char err[512];
    if (f->trace && trace_steps(f, start, &first, &last)) return 2;
    RtTrace *trace = f->trace ? rt_trace_new(r->e, first, last, err, sizeof err) : NULL;
    if (f->trace && !trace) {
        fprintf(stderr, "%s: --trace: %s\n", who, err);
        return local_error(1);
    }
    RtCheckpointOptions co = {.dir = f->checkpoint_dir, .keep = (int)f->keep, .seed = seed,
                              .data = rt_data_describe(r->data), .data_path = f->data, .order = f->order,
                              .bytes = r->ck_bytes};
    RtTrainOptions o = {.steps = f->steps, .start = start, .checkpoint = f->checkpoint_dir ? &co : NULL,
                        .save_every = f->save_every, .stop = stop_signal, .overflow_at = f->overflow_at,
                        .save_grads = f->save_grads, .cuda_graph = f->cuda_graph, .debug_nan = f->debug_nan,
                        .who = who, .path = path, .rank = my_rank, .world = my_world, .reached = reached,
                        .stopped_by = stopped_by, .eval = r->eval, .eval_every = f->eval_every,
                        .trace = trace};
    int rc = rt_train(r->e, r->data, &r->dev, &r->progress, &o);
    if (trace && rc != RT_TRAIN_LOCAL) {  // every rank alike: the steps went, or stopped, together
        if (rt_trace_write(trace, f->trace, err, sizeof err)) {
            fprintf(stderr, "%s: --trace: %s\n", who, err);
            rc = rc ? rc : 1;
        } else if (my_rank == 0) {
            char to[32] = "";
            if (last > first) snprintf(to, sizeof to, " to %" PRId64, last);
            fprintf(stderr, "%s: trace of step%s %" PRId64 "%s in %s (open it in ui.perfetto.dev)\n", who,
                    last > first ? "s" : "", first, to, f->trace);
        }
    }
    rt_trace_free(trace);
    if (rc == RT_TRAIN_STOPPED) {  // every rank alike, for the signal any of them saw
        int reporter = (layout.stages - 1) * layout.dp, sig = rt_signal_of(*stopped_by);
        if (my_rank == reporter)
            fprintf(stderr, "%s: stopped by %s; %s\n", who, sig == SIGINT ? "SIGINT" : "SIGTERM",
                    f->checkpoint_dir ? "the checkpoint above has every step so far: continue with --resume"
                                      : "nothing saved (no --checkpoint-dir)");
        return 128 + sig;
    }
    return rc == RT_TRAIN_LOCAL ? local_error(1) : rc;
}

/* Every rank reads the file; a failure anywhere is every rank's (the result is agreed). */
static int load_weights(Exec *e, const char *path, RtWeightsFormat fmt, char *err, size_t errlen)
{
    rt_watchdog_arm("loading the weights", -1);
    int rc = rt_load_weights_as(e, path, fmt, err, errlen);
    rt_watchdog_disarm();
    return rc;
}

/* --predict, once the params are in e, on r->dev (chosen for the eval program; rt_predict
 * opens and closes it): 0, or 1 after a message. */
static int predict(const Flags *f, const Plan *whole, Run *r, const RtRanks *rk, uint64_t seed)
{
    char err[1024] = "", written[2048];
    RtPredictOptions o = {.data = f->data, .out = f->out, .seed = seed, .dev = &r->dev, .rk = rk, .tf32 = f->tf32,
                          .graph = f->cuda_graph};
    double t0 = rt_now();
    int rc = rt_predict(whole, r->e, &o, written, sizeof written, err, sizeof err);
    if (rc && err[0]) fprintf(stderr, "%s: %s\n", who, err);
    if (rc) return rc == -2 ? local_error(1) : 1;  // -2: this rank's device failed; the others may wait in NCCL
    if (written[0]) fprintf(stderr, "%s: wrote %s in %.2f s\n", who, written, rt_now() - t0);
    return 0;
}

/* The run after the world is joined, on p, this rank's stage's program of `whole` (or
 * whole itself): the Exec (the host mirror), the data, the weights or the resumed
 * checkpoint, the device, the steps, the saved weights. 0, or an exit status after a
 * message. */
static int run_plan(Run *r, const Flags *f, const Plan *whole, const Plan *p, const RtRanks *rk, uint64_t seed)
{
    char err[512];
    int64_t start = r->resume ? rt_checkpoint_step(r->resume) : 0;
    ProgressOptions po = {.steps = f->steps, .start = start, .append = r->resume != NULL, .log_every = f->log_every,
                          .log_path = f->log, .tty = -1};
    /* --predict runs the evaluation program alone: its CUDA program and arena decide. */
    const Plan *runs = f->predict && whole->eval ? whole->eval : whole;
    int rc = rt_device_choose(&r->dev, (RtDeviceKind)f->device, f->debug_nan || f->debug_guard, runs,
                              rk->local_rank, who);
    if (rc) return rc;
    /* For a device, the Exec is its host mirror: the persistent state and the outputs
     * (--save-grads reads every gradient: then all of it). */
    int reporter = (layout.stages - 1) * layout.dp;  // rank 0, or the last stage's first: it has the logits
    ExecOptions eo = {.seed = seed, .nan_fill = f->debug_nan, .guard = f->debug_guard, .rank = rk->rank % layout.dp,
                      .world = layout.dp, .mirror = !rt_device_is_cpu(&r->dev) && !f->save_grads,
                      .whole = layout.stages > 1 ? whole : NULL, .stage = rk->rank / layout.dp,
                      .sync_sends = f->sync_sends, .one_by_one = f->one_by_one};
    if (!(r->e = rt_exec_new(p, &eo, err, sizeof err))) {
        fprintf(stderr, "%s: %s: %s\n", who, f->plan, err);
        return local_error(1);
    }
    /* No step draws a batch (--steps 0: export the init, checkpoint it): inputs only .npy
     * files could feed need none. */
    int idle = f->predict || (!f->data && f->steps <= start && rt_data_kind(whole) == RT_DATA_NONE);
    r->data = idle ? rt_data_idle(err, sizeof err)
                   : rt_data_open_as(r->e, f->data, f->data_format, f->order, seed, err, sizeof err);
    if (!r->data) {
        fprintf(stderr, "%s: %s\n", who, err);
        return local_error(1);
    }
    RtEvalOptions vo = {.path = f->val_data, .format = f->data_format, .batches = f->eval_batches, .seed = seed,
                        .nan_fill = f->debug_nan};
    if (f->val_data && !(r->eval = rt_eval_new(whole, r->e, &vo, err, sizeof err))) {
        fprintf(stderr, "%s: %s\n", who, err);
        return local_error(1);
    }
    if (f->load_weights && load_weights(r->e, f->load_weights, f->load_format, err, sizeof err)) {  // agreed
        if (err[0]) fprintf(stderr, "%s: %s\n", who, err);
        return 1;
    }
    RtResumed resumed;
    double t_load = rt_now();
    if (r->resume) {
        rt_watchdog_arm("loading the checkpoint", -1);
        rc = rt_checkpoint_load_as(r->resume, r->e, f->resume_partial, &resumed, err, sizeof err);  // agreed
        rt_watchdog_disarm();
        if (rc) {
            if (err[0]) fprintf(stderr, "%s: --resume: %s\n", who, err);
            return 1;
        }
    }
    t_load = rt_now() - t_load;
    if (f->predict) return predict(f, whole, r, rk, seed);
    int32_t report[8];
    if (rt_device_open(&r->dev, r->e, rk, compiled_tf32(whole), f->trace != NULL, report,
                       rt_train_reported(r->e, r->data, report)))
        return local_error(1);
    po.unit = rt_data_get_kind(r->data) == RT_DATA_LM ? "tok" : "samples";
    if ((f->steps || r->eval) && my_rank == reporter && !(r->progress = rt_progress_new(&po, err, sizeof err))) {
        fprintf(stderr, "%s: %s\n", who, err);
        return local_error(1);
    }
    if (my_rank == reporter) start_line(whole, r, f, seed), schedule_note(whole, f->steps);
    if (my_rank == reporter && r->resume) {
        char line[2048];
        rt_resumed_describe(r->resume, &resumed, whole, line, sizeof line);
        fprintf(stderr, "fsexec: %s (loaded in %.2f s)\n", line, t_load);
    }
    int64_t reached = start;
    int stopped_by = 0;
    rc = train(r, f, f->plan, seed, start, &reached, &stopped_by);
    int ended = end_progress(r), stopped = stopped_by && rc == 128 + rt_signal_of(stopped_by);
    rc = rc ? rc : ended;
    /* The weights after the last step, or after the step a signal stopped the run at. */
    rt_watchdog_arm("saving the weights", -1);
    const unsigned state = 1u << PLAN_ROLE_PARAM | 1u << PLAN_ROLE_OPT_STATE | 1u << PLAN_ROLE_MASTER;
    int save = f->save_weights && (!rc || stopped);
    if (save && rt_device_download_roles(&r->dev, r->e, state, 0)) {
        rt_device_print_error(&r->dev, 0);
        rc = local_error(1);
    }
    if (save && rt_save_weights_as(r->e, f->save_weights, reached, f->save_format, err, sizeof err)) {
        if (err[0]) fprintf(stderr, "%s: %s\n", who, err);
        rc = 1;
    }
    rt_watchdog_disarm();
    /* Stopped by the launcher's relay (fsexec --nproc): it reports the signal in its exit
     * status; a rank's non-zero one would only add mpirun's message. */
    return stopped && rc == 128 + rt_signal_of(stopped_by) && rt_signal_relayed(stopped_by) ? 0 : rc;
}

/* The checkpoint against this run's model and data (record.c), before any state is
 * read: every rank computes the same from the same files; rank 0 says it. 0, or 1. */
static int check_resume(const Flags *f, const RtCheckpoint *c, const Plan *whole)
{
    char msg[4096];
    int model = rt_resume_check_model(c, whole, msg, sizeof msg);
    if (model && my_rank == 0)
        fprintf(stderr, "%s: --resume: %s%s\n", model > 0 && f->resume_partial ? "fsexec: note" : "fsexec", msg,
                model < 0           ? ""
                : f->resume_partial ? "; --resume-partial: what both have in the same shape loads, the rest starts "
                                      "as initialized"
                                    : "; give --resume-partial to load what both have in the same shape on purpose "
                                      "(the rest starts as initialized)");
    if (model < 0 || (model > 0 && !f->resume_partial)) return 1;
    if (f->predict) return 0;  // --data is the samples to predict, not the run's data
    int data = rt_resume_check_data(c, f->data, f->resume_other_data, msg, sizeof msg);
    if (data && my_rank == 0) fprintf(stderr, "fsexec: %s--resume: %s\n", data < 0 ? "" : "warning: ", msg);
    return data < 0 ? 1 : 0;
}

/* Before any step: no output is a file of --resume's checkpoint, and --checkpoint-dir
 * holds only fsexec's own files under a checkpoint's names, with room for one more
 * (rank 0 looks; every rank agrees). 0, or 1 after a message. */
static int check_checkpoint_files(const Flags *f, Run *r, const Plan *whole)
{
    const char *flags[] = {"--save-weights", "--save-grads", "--log", "--trace"};
    const char *paths[] = {f->save_weights, f->save_grads, f->log, f->trace};
    char err[512];
    int rc = 0;
    for (int i = 0; i < 4 && r->resume && !rc; i++) {
        const char *own = paths[i] ? rt_checkpoint_holds(r->resume, paths[i]) : NULL;
        if (own && my_rank == 0)
            fprintf(stderr, "%s: %s %s is %s/%s, a file of the checkpoint this run resumes: give another file\n", who,
                    flags[i], paths[i], rt_checkpoint_dir(r->resume), own);
        rc = own ? 1 : 0;
    }
    if (!rc && f->checkpoint_dir && my_rank == 0) {
        r->ck_bytes = rt_checkpoint_size(whole, err, sizeof err);
        if (r->ck_bytes < 0 || rt_checkpoint_check_dir(f->checkpoint_dir, r->ck_bytes, err, sizeof err)) {
            fprintf(stderr, "%s: --checkpoint-dir %s: %s\n", who, f->checkpoint_dir, err);
            rc = 1;
        }
    }
    return rt_comm_agree(rc);
}

int run(const Flags *f)
{
    Plan *whole = load(f->plan), *one = NULL;  // one: this rank's stage's program, in a pipeline
    if (!whole) return 1;
    if (check_tf32(f, whole)) {
        plan_free(whole);
        return 2;
    }
    RtRanks rk;
    char err[512];
    int rc = join_world(f, whole, &rk);
    if (!rc && layout.stages > 1 && !(one = plan_extract_program(whole, rk.rank / layout.dp, err, sizeof err))) {
        fprintf(stderr, "%s: %s: %s\n", who, f->plan, err);
        rc = local_error(1);
    }
    Run r = {0};
    if (!rc && f->resume) {  // every rank opens and checks it; they agree before any goes on
        rt_watchdog_arm("opening the checkpoint", -1);
        r.resume = rt_checkpoint_open(f->resume, err, sizeof err);
        rt_watchdog_disarm();
        if (!r.resume) fprintf(stderr, "%s: --resume: %s\n", who, err);
        rc = rt_comm_agree(r.resume ? 0 : 1);
    }
    if (!rc) rc = check_checkpoint_files(f, &r, whole);
    if (!rc && r.resume) rc = check_resume(f, r.resume, whole);
    if (!rc && r.resume && rt_checkpoint_step(r.resume) >= f->steps && !f->predict) {
        if (my_rank == 0)
            fprintf(stderr, "fsexec: %s is at step %" PRId64 " and --steps %" PRId64 " is the run's total: nothing to "
                    "run (give a larger --steps to go on)\n", rt_checkpoint_dir(r.resume), rt_checkpoint_step(r.resume),
                    f->steps);
    } else if (!rc) {
        rt_set_threads(f->threads);
        uint64_t seed = f->has_seed ? f->seed
                        : r.resume ? rt_checkpoint_seed(r.resume) : (uint64_t)plan_meta_int(whole, "seed", 0);
        stop_signal = rt_signals_catch(who, my_rank);
        rc = run_plan(&r, f, whole, one ? one : whole, &rk, seed);
    }
    run_free(&r);
    rt_comm_finalize();
    plan_free(one);
    plan_free(whole);
    return rc;
}
