/* runtime/step.c: the step loop, for every backend alike (runtime/device.c).
 *
 * Each step: the batch into the host mirror (rt_data_fill), the step number and inputs
 * up, the step on the device, the reported outputs down, one progress line. Everything
 * the loop reads it finds by step role (plan.h: PlanStepRole), never by name: the loss,
 * lr, grad norm, fp16 loss scale, the optimizer's step counter (the step was skipped
 * when it did not move) and the fp16 backward seed that --debug-overflow-at poisons.
 * The loop allocates nothing; --save-grads writes a file in step 1, between backward
 * and the first optimizer op, where every gradient is complete and live. A resumed run
 * starts after the checkpoint's step. After a step: a checkpoint every save_every steps,
 * after the last, and when a signal asked every rank to stop (they agree at each step
 * boundary, so all stop after the same one; a signal during a save stops the run after
 * it, the checkpoint just written having every step so far). With --val-data (runtime/eval.c): an
 * evaluation before the first step of a run from step 0, every eval_every steps and
 * after the last, shown on that step's line.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "runtime.h"

/* What a waiting rank's watchdog names when another rank does not reach the step's end. */
#define STOP_AGREEMENT "the step's end, where every rank agrees whether a signal stops training (MPI_Allreduce)"

/* The f32 scalar with step role r, or NULL. */
static const float *scalar(const Exec *e, PlanStepRole r)
{
    int32_t id = plan_role_tensor(rt_exec_plan(e), r);
    if (id == PLAN_NONE) return NULL;
    RtTensor t;
    rt_exec_tensor_id(e, id, &t);
    return t.dtype == PLAN_DT_F32 && t.numel == 1 ? t.data : NULL;
}

/* For classifiers: logits [B, K] f32 among the outputs and labels i32 [B], where this
 * rank's stage has them. */
static int accuracy_inputs(const Exec *e, const RtData *data, const float **logits, const int32_t **y, int64_t *B,
                           int64_t *K)
{
    int32_t yi = rt_data_labels(data), li = rt_data_logits(data);
    if (li == PLAN_NONE || yi == PLAN_NONE) return -1;
    RtTensor lt, yt;
    rt_exec_tensor_id(e, li, &lt);
    rt_exec_tensor_id(e, yi, &yt);
    if (lt.dtype != PLAN_DT_F32 || lt.rank != 2 || yt.dtype != PLAN_DT_I32 || yt.rank != 1 || yt.shape[0] != lt.shape[0])
        return -1;
    *logits = lt.data, *y = yt.data, *B = lt.shape[0], *K = lt.shape[1];
    return 0;
}

int rt_train_reported(const Exec *e, const RtData *data, int32_t *ids)
{
    const Plan *p = rt_exec_plan(e);
    static const PlanStepRole roles[] = {PLAN_SR_LOSS, PLAN_SR_LR, PLAN_SR_GRAD_NORM, PLAN_SR_LOSS_SCALE,
                                         PLAN_SR_OPT_STEP};
    int n = 0;
    for (int i = 0; i < 5; i++) ids[n++] = plan_role_tensor(p, roles[i]);
    ids[n++] = rt_data_logits(data);
    return n;
}

static void end_progress(Progress **progress, const char *who)
{
    char err[256];
    if (*progress && rt_progress_end(*progress, err, sizeof err)) fprintf(stderr, "%s: %s\n", who, err);
    *progress = NULL;
}

/* One step's device work: as asked by the debug flags, else the whole step. */
static int run_step(Exec *e, RtDevice *d, const RtTrainOptions *o, int64_t step, int32_t seed_op)
{
    const Plan *p = rt_exec_plan(e);
    if (step == o->overflow_at) {  // up to the backward's seed, make it infinite, the rest
        int32_t seed = plan_role_tensor(p, PLAN_SR_LOSS_SEED);
        if (rt_device_run_ops(d, 0, seed_op + 1)) return -1;
        *(float *)rt_exec_data(e, seed) = INFINITY;
        return rt_device_move(d, e, 1, &seed, 1) || rt_device_run_ops(d, seed_op + 1, p->n_ops);
    }
    if (step == 1 && o->save_grads) {
        char err[512];
        int32_t split = rt_save_grads_point(e, err, sizeof err);  // checked before step 1
        if (rt_device_run_ops(d, 0, split) || rt_device_download_roles(d, e, 1u << PLAN_ROLE_GRAD, 1)) return -1;
        if (rt_save_grads(e, o->save_grads, step, err, sizeof err)) {
            fprintf(stderr, "%s: %s\n", o->who, err);
            return -2;
        }
        return rt_device_run_ops(d, split, p->n_ops);
    }
    RtSpan *spans = rt_trace_step(o->trace, step);
    if (spans) return rt_device_run_step_timed(d, spans);
    return rt_device_run_step(d, o->cuda_graph && step > 1);  // step 1 warms up (NVRTC, cuBLAS) first
}

/* The checkpoint after `step`: the state down from the device, every rank's part
 * written; where it went on the reporting rank's progress. 0; 1 after a message (agreed);
 * RT_TRAIN_LOCAL for this rank's device error. */
static int checkpoint(Exec *e, RtDevice *d, Progress *progress, int64_t step, const RtTrainOptions *o)
{
    const unsigned state = 1u << PLAN_ROLE_PARAM | 1u << PLAN_ROLE_OPT_STATE | 1u << PLAN_ROLE_MASTER;
    if (rt_device_download_roles(d, e, state, 0)) {
        rt_device_print_error(d, step);
        return RT_TRAIN_LOCAL;
    }
    char err[512];
    RtSaved s;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/step-%08" PRId64, o->checkpoint->dir, step);
    rt_signals_saving(dir, step);  // a second signal in the save abandons it
    rt_watchdog_arm("saving a checkpoint after step", step);
    int rc = rt_checkpoint_save(e, step, o->checkpoint, &s, err, sizeof err);
    rt_watchdog_disarm();
    rt_signals_saving(NULL, 0);
    if (rc) {
        if (err[0]) fprintf(stderr, "%s: checkpoint after step %" PRId64 ": %s\n", o->who, step, err);
        return 1;
    }
    if (progress)
        rt_progress_note(progress, "step %" PRId64 ": checkpoint %s (%d file%s, %.2f MiB, %.2f s)", step, s.path,
                         s.files, s.files == 1 ? "" : "s", (double)s.bytes / (1 << 20), s.seconds);
    else if (o->rank == 0 && o->steps == 0)  // no progress on any rank: the initial state
        fprintf(stderr, "%s: checkpoint %s of the initial state (%d file%s, %.2f MiB, %.2f s)\n", o->who, s.path,
                s.files, s.files == 1 ? "" : "s", (double)s.bytes / (1 << 20), s.seconds);
    return 0;
}

/* An evaluation of the params after `step` (a device's first brought down into the
 * host mirror the eval program copies them from); 0, or RT_TRAIN_LOCAL after a message. */
static int evaluate(Exec *e, RtDevice *d, const RtTrainOptions *o, int64_t step, double *loss, double *accuracy)
{
    char err[512];
    if (!rt_device_is_cpu(d) && rt_device_download_roles(d, e, 1u << PLAN_ROLE_PARAM, 0)) {
        rt_device_print_error(d, step);
        return RT_TRAIN_LOCAL;
    }
    rt_watchdog_arm("evaluating after step", step);
    int rc = rt_eval_run(o->eval, loss, accuracy, err, sizeof err);
    rt_watchdog_disarm();
    if (rc) fprintf(stderr, "%s: step %" PRId64 ": %s\n", o->who, step, err);
    return rc ? RT_TRAIN_LOCAL : 0;
}

int rt_train(Exec *e, RtData *data, RtDevice *d, Progress **progress, const RtTrainOptions *o)
{
    char err[512];
    const Plan *p = rt_exec_plan(e);
    const float *loss = scalar(e, PLAN_SR_LOSS), *lr = scalar(e, PLAN_SR_LR), *norm = scalar(e, PLAN_SR_GRAD_NORM);
    const float *scale = scalar(e, PLAN_SR_LOSS_SCALE), *logits = NULL;
    if (!loss) {
        fprintf(stderr, "%s: %s: the plan has no f32 scalar loss (step role 'loss')\n", o->who, o->path);
        return RT_TRAIN_LOCAL;
    }
    const int32_t *labels = NULL, *count = NULL;
    int64_t B = 0, K = 0;
    accuracy_inputs(e, data, &logits, &labels, &B, &K);  // a classifier's (its labels and logits known), else none
    int32_t count_id = plan_role_tensor(p, PLAN_SR_OPT_STEP), seed_id = plan_role_tensor(p, PLAN_SR_LOSS_SEED);
    if (count_id != PLAN_NONE && p->tensors[count_id].dtype == PLAN_DT_I32) count = rt_exec_data(e, count_id);
    int32_t seed_op = seed_id != PLAN_NONE ? p->tensors[seed_id].producer : PLAN_NONE;
    if (o->overflow_at && (seed_op == PLAN_NONE || p->tensors[seed_id].dtype != PLAN_DT_F32)) {
        fprintf(stderr, "%s: %s: --debug-overflow-at needs an fp16 plan (fsc --precision fp16)\n", o->who, o->path);
        return RT_TRAIN_LOCAL;
    }
    if (o->save_grads && o->start == 0 && rt_save_grads_point(e, err, sizeof err) < 0) {
        fprintf(stderr, "%s: %s: %s\n", o->who, o->path, err);
        return RT_TRAIN_LOCAL;
    }
    double items = (double)rt_data_items(data);
    if (o->checkpoint && o->steps == 0) return checkpoint(e, d, *progress, 0, o);  // the state before any step
    if (o->eval && o->start == 0) {  // the initial params, as nanoGPT evaluates at iteration 0
        double vl, va;
        if (evaluate(e, d, o, 0, &vl, &va)) return RT_TRAIN_LOCAL;
        if (rt_progress_eval(*progress, 0, vl, va, err, sizeof err)) {
            fprintf(stderr, "%s: %s\n", o->who, err);
            return RT_TRAIN_LOCAL;
        }
    }
    for (int64_t step = o->start + 1; step <= o->steps; step++) {
        double t0 = rt_now();
        rt_watchdog_arm("step", step);
        rt_data_fill(data, step);
        double scale_before = scale ? *scale : NAN;
        int32_t count_before = count ? *count : 0;
        int64_t host0, dev0, host1, dev1;
        rt_device_copied(d, e, &host0, &dev0);
        int rc = rt_device_step_in(d, e, step);
        rc = rc ? rc : run_step(e, d, o, step, seed_op);
        rc = rc ? rc : rt_device_step_out(d, e);
        if (rc) {
            end_progress(progress, o->who);
            if (rc != -2) rt_device_print_error(d, step);
            return RT_TRAIN_LOCAL;
        }
        rt_device_copied(d, e, &host1, &dev1);
        int64_t W = logits ? rt_plan_valid_columns(rt_exec_plan(e), K) : 0;  // a padded classifier's own classes
        int64_t counted = 0;
        int64_t right = logits ? rt_correct_of(logits, labels, B, K, W, rt_data_ignore(data), &counted) : 0;
        int dp = rt_exec_world(e);  // over the global batch, like the loss: the stage's data-parallel ranks
        if (logits && dp > 1) right = rt_comm_sum_i64(right), counted = rt_comm_sum_i64(counted);
        double accuracy = counted ? (double)right / (double)counted : NAN;  // every label ignored: NaN
        rt_watchdog_disarm();
        double ms = (rt_now() - t0) * 1e3;  // the step's, without the evaluation after it
        int evaluated = o->eval && (step == o->steps || (o->eval_every && step % o->eval_every == 0));
        double vl = NAN, va = NAN;
        if (evaluated && evaluate(e, d, o, step, &vl, &va)) {
            end_progress(progress, o->who);
            return RT_TRAIN_LOCAL;
        }
        StepStats s = {.evaluated = evaluated, .val_loss = vl, .val_accuracy = va,.step = step, .loss = *loss, .lr = lr ? *lr : NAN, .grad_norm = norm ? *norm : NAN,
                       .ms = ms, .items = items, .accuracy = accuracy,
                       .has_scale = scale != NULL, .loss_scale = scale ? *scale : NAN, .scale_before = scale_before,
                       .skipped = count && *count == count_before, .to_host_bytes = host1 - host0,
                       .to_device_bytes = dev1 - dev0};
        if (rt_progress_step(*progress, &s, err, sizeof err)) {
            fprintf(stderr, "%s: %s\n", o->who, err);
            return RT_TRAIN_LOCAL;
        }
        if (!isfinite(s.loss)) {  // the global loss: every rank stops here
            end_progress(progress, o->who);
            if (o->rank == 0)
                fprintf(stderr, "%s: step %" PRId64 ": the loss is %g; stopping (%s)\n", o->who, step, s.loss,
                        o->debug_nan ? "with --debug-nan this is a buffer read outside its planned live range: a "
                                       "bug in the plan"
                                     : "a lower learning rate may help; --debug-nan checks the plan's buffer reuse");
            return 1;
        }
        if (o->reached) *o->reached = step;
        /* Every rank stops at the same step: a signal reaches them at different moments. The
         * agreement is a collective, watched as the step is: a rank that stopped running
         * (SIGSTOP) or died would hold every other rank in it. */
        int last = step == o->steps, stop = 0;
        if (o->stop) {
            rt_watchdog_arm("step", step);  // part of the step: its end, agreed
            stop = rt_comm_agree_on((int)*o->stop, STOP_AGREEMENT);  // the signal, agreed
            rt_watchdog_disarm();
        }
        if (last) stop = 0;
        if (stop && o->stopped_by) *o->stopped_by = stop;
        if (o->checkpoint && (last || stop || (o->save_every && step % o->save_every == 0))) {
            int saved = checkpoint(e, d, *progress, step, o);
            if (saved) {
                end_progress(progress, o->who);
                return saved;
            }
            if (!last && !stop && o->stop) {  // a signal in the save: this checkpoint has every step so far
                rt_watchdog_arm("step", step);
                stop = rt_comm_agree_on((int)*o->stop, STOP_AGREEMENT);
                rt_watchdog_disarm();
                if (stop && o->stopped_by) *o->stopped_by = stop;
            }
        }
        if (stop) {
            end_progress(progress, o->who);
            return RT_TRAIN_STOPPED;
        }
    }
    return 0;
}
