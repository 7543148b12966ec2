/* tools/fsexec_report.c: what the reporting rank says around a run: the start line (model,
 * device, params, arenas, threads, ranks, data, steps, seed), the note on a learning-rate
 * schedule that the run's --steps cuts short or outlasts, and the end of the progress
 * display (runtime/progress.c: its summary line, where the step lines go). Invariants: only
 * the reporting rank (rank 0, or a pipeline's last stage's first) calls start_line and
 * schedule_note, and they write to stderr; nothing here changes the run. Called by
 * run_plan and run_free (fsexec_run.c).
 */
#include <inttypes.h>
#include <string.h>

#include "fsexec.h"
#include "report.h"  // report_bytes: sizes as fsc --mem writes them

/* Ends the progress display (its summary line) once; 0, or 1 after a message. */
int end_progress(Run *r)
{
    char err[256];
    int rc = rt_progress_end(r->progress, err, sizeof err);
    r->progress = NULL;
    if (rc) fprintf(stderr, "%s: %s\n", who, err);
    return rc ? 1 : 0;
}

/* The model's params: meta "params", else each param once (by name: two stages of a
 * pipeline may hold one, as a tied embedding). */
static int64_t count_params(const Plan *p)
{
    int64_t params = plan_meta_int(p, "params", -1);
    if (params >= 0) return params;
    params = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        int seen = 0;
        for (int32_t j = 0; j < i && p->n_programs > 1 && !seen; j++)
            seen = p->tensors[j].role == PLAN_ROLE_PARAM && p->tensors[j].name == t->name && t->name != PLAN_NONE;
        if (t->role == PLAN_ROLE_PARAM && t->tied_to == PLAN_NONE && !seen) params += plan_tensor_numel(t);
    }
    return params;
}

/* The start line, by the reporting rank; p is the whole plan. */
void start_line(const Plan *p, const Run *r, const Flags *f, uint64_t seed)
{
    int64_t params = count_params(p);
    char num[32], mem[160] = "", threads[80] = "", work_buf[32];
    for (int32_t k = 0; k < p->n_programs && layout.stages > 1; k++) {  // each stage's arena
        size_t at = strlen(mem);
        snprintf(mem + at, sizeof mem - at, "%s", k ? " / " : "");
        at = strlen(mem);
        report_bytes(p->programs[k].space_bytes[PLAN_PLACE_DEVICE], mem + at, sizeof mem - at);
    }
    if (layout.stages == 1) report_bytes(rt_exec_arena_bytes(r->e), mem, sizeof mem);
    if (layout.stages == 1 && rt_exec_space_bytes(r->e, PLAN_PLACE_HOST) > 0) {  // offload's host space
        size_t at = strlen(mem);
        snprintf(mem + at, sizeof mem - at, " + host ");
        at = strlen(mem);
        report_bytes(rt_exec_space_bytes(r->e, PLAN_PLACE_HOST), mem + at, sizeof mem - at);
    }
    if (rt_device_is_cpu(&r->dev)) {  // the CPU's threads, and the kernels' workspace outside the arena (16-bit plans)
        char work[32];
        int n = snprintf(threads, sizeof threads, " | %d thread%s", rt_threads(), rt_threads() == 1 ? "" : "s");
        if (rt_exec_work_bytes(r->e) > 0)
            snprintf(threads + n, sizeof threads - (size_t)n, " | workspace %s",
                     report_bytes(rt_exec_work_bytes(r->e), work, sizeof work));
    }
    else  // the host memory a device run takes for tensors: its mirror
        snprintf(threads, sizeof threads, " | host mirror %s",
                 report_bytes(rt_exec_host_bytes(r->e), work_buf, sizeof work_buf));
    if (r->eval) {  // the evaluation program's arena, beside the training's
        size_t at = strlen(mem);
        snprintf(mem + at, sizeof mem - at, " + eval ");
        at = strlen(mem);
        report_bytes(rt_eval_arena_bytes(r->eval), mem + at, sizeof mem - at);
    }
    char ranks[160] = "", shard[64];  // "fsdp", or with hybrid sharding "fsdp in groups of 2"
    int64_t group = plan_shard_group(p, layout.dp);
    snprintf(shard, sizeof shard, "%s", plan_meta_str(p, "shard", "?"));
    if (group < layout.dp)
        snprintf(shard + strlen(shard), sizeof shard - strlen(shard), " in groups of %" PRId64, group);
    if (my_world > 1 && layout.stages > 1)
        snprintf(ranks, sizeof ranks, " | %d ranks (%d stages x %d, %s)", my_world, layout.stages, layout.dp, shard);
    else if (my_world > 1)
        snprintf(ranks, sizeof ranks, " | %d ranks (%s)", my_world, shard);
    char steps[64];  // "100 steps", or resumed: "steps 301-1000"
    int64_t start = r->resume ? rt_checkpoint_step(r->resume) : 0;
    if (start) snprintf(steps, sizeof steps, "steps %" PRId64 "-%" PRId64, start + 1, f->steps);
    else snprintf(steps, sizeof steps, "%" PRId64 " step%s", f->steps, f->steps == 1 ? "" : "s");
    fprintf(stderr, "fsexec: %s | device: %s | %s params | arena %s%s%s%s | data: %s | %s, seed %"
            PRIu64 "%s%s%s\n", plan_meta_str(p, "model", "model"), r->dev.name, report_grouped(params, num, sizeof num),
            mem,
            layout.stages > 1 ? " per rank by stage" : my_world > 1 ? " per rank" : "", threads, ranks,
            rt_data_describe(r->data), steps, seed,
            f->debug_nan ? " | debug-nan" : f->debug_guard ? " | debug-guard" : "",
            !rt_device_is_cpu(&r->dev) && f->cuda_graph ? " | cuda-graph" : "",
            !rt_device_is_cpu(&r->dev) && compiled_tf32(p) ? " | tf32" : "");
    rt_device_report(&r->dev, stderr);
}

/* The learning-rate schedule's length (fsc --steps, META "steps") against the run's
 * (--steps, the total whatever a resumed run starts at). Only a decaying schedule (cosine,
 * linear, wsd) has an end: lr_at (runtime/cpu/optim.c) holds it at min_lr past `steps`,
 * and a run cut short never gets there. A constant one, warmup or not, runs the same at
 * any length. */
void schedule_note(const Plan *p, int64_t steps)
{
    int64_t end = plan_meta_int(p, "steps", 0);
    if (steps <= 0 || end <= 0 || end == steps || !strcmp(plan_meta_str(p, "lr_schedule", "constant"), "constant"))
        return;
    if (steps < end)
        fprintf(stderr, "fsexec: note: the learning-rate schedule runs to step %" PRId64 " (fsc --steps); this run "
                "stops at step %" PRId64 ", before it ends\n", end, steps);
    else
        fprintf(stderr, "fsexec: note: the learning-rate schedule runs to step %" PRId64 " (fsc --steps); this run "
                "goes on to step %" PRId64 ", but the schedule ended at step %" PRId64 ": the rest runs at "
                "min_lr (%g)\n", end, steps, end, plan_meta_float(p, "min_lr", 0));
}
