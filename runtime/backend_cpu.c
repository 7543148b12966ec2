/* runtime/backend_cpu.c: the CPU backend behind the same table as the CUDA one
 * (runtime/backend.h), so the step loop (step.c) drives either the same way. Its device
 * is the host mirror itself: the Exec runs the plan on its own arenas, so uploads and
 * downloads move nothing, and the step number is the one the step loop wrote into the
 * plan's step input (PLAN_SR_STEP) before the run.
 */
#include <string.h>

#include "runtime.h"

struct RtBackend {
    Exec *e;
    const int32_t *step;  // the step input in the Exec's arena, or NULL
    char err[600];
};

static int probe(char *err, size_t errlen)
{
    (void)err, (void)errlen;
    return 0;
}

static RtBackend *create(const RtBackendOptions *o, char *err, size_t errlen)
{
    RtBackend *b = plan_alloc(sizeof *b);
    if (!b) {
        plan_fail(err, errlen, "[rank %d] out of memory", o->rank);
        return NULL;
    }
    memset(b, 0, sizeof *b);
    b->e = o->exec;
    int32_t step = plan_role_tensor(o->plan, PLAN_SR_STEP);
    b->step = step != PLAN_NONE ? rt_exec_data(o->exec, step) : NULL;
    return b;
}

static void destroy(RtBackend *b) { plan_dealloc(b); }

/* The step the loop wrote; 1 for a plan without a step input. */
static int64_t step_of(const RtBackend *b) { return b->step && *b->step > 0 ? *b->step : 1; }

static int failed(RtBackend *b, int64_t step)
{
    snprintf(b->err, sizeof b->err, "fsexec: step %lld: %s", (long long)step, rt_exec_error(b->e));
    return -1;
}

static int run_ops(RtBackend *b, int32_t from, int32_t to)
{
    int64_t step = step_of(b);
    return rt_exec_run_ops(b->e, step, from, to, RT_PHASES_ALL) ? failed(b, step) : 0;
}

static int run_step(RtBackend *b, int graph)
{
    (void)graph;  // nothing to capture: the CPU runs the schedule as it is
    int64_t step = step_of(b);
    return rt_exec_run(b->e, step, RT_PHASES_ALL) ? failed(b, step) : 0;
}

static int run_step_timed(RtBackend *b, RtSpan *spans)
{
    int64_t step = step_of(b);
    if (rt_exec_time(b->e, spans)) {
        snprintf(b->err, sizeof b->err, "fsexec: step %lld: out of memory for the trace", (long long)step);
        return -1;
    }
    int rc = rt_exec_run(b->e, step, RT_PHASES_ALL);
    rt_exec_time(b->e, NULL);
    return rc ? failed(b, step) : 0;
}

/* The device is the host mirror: nothing moves. */
static int move(RtBackend *b, int32_t tensor, void *host)
{
    (void)b, (void)tensor, (void)host;
    return 0;
}
static int upload(RtBackend *b, int32_t tensor, const void *src) { return move(b, tensor, (void *)src); }
static int sync_all(RtBackend *b)
{
    (void)b;
    return 0;
}

static void info(const RtBackend *b, RtBackendInfo *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->device, sizeof out->device, "cpu");
    out->arena_planned = out->arena = rt_exec_arena_bytes(b->e);
}

static const char *error(const RtBackend *b) { return b->err; }

const RtBackendOps *rt_backend_cpu(void)
{
    static const RtBackendOps ops = {.abi = RT_BACKEND_ABI, .name = "cpu", .probe = probe, .create = create,
                                     .destroy = destroy, .run_ops = run_ops, .run_step = run_step,
                                     .run_step_timed = run_step_timed,
                                     .upload = upload, .download = move, .sync = sync_all, .info = info,
                                     .error = error};
    return &ops;
}
