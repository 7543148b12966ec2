/* runtime/device.c: the device a run's steps go to, behind one table (runtime/backend.h):
 * the CPU backend (backend_cpu.c) or the CUDA one (libfs_cuda.so, loaded with dlopen).
 *
 * The CPU Exec is the host mirror: params, state and each batch are made there, files
 * are read from and written to it; with offload it holds the plan's host space whole,
 * whose ops the backend has it run (rt_exec_run_host_op), and a tensor there never moves. The device holds the working copy (for the CPU, the
 * mirror itself, and every move is nothing); this file moves exactly what crosses
 * between the two: before each step the plan's inputs (the batch and the step number),
 * after it the few outputs the progress line reports, and before files are written the
 * tensors they hold. Nothing here allocates inside a step.
 */
#include <stdlib.h>
#include <string.h>

#include "report.h"  // report_bytes: sizes as fsc --mem writes them
#include "runtime.h"

/* Why auto runs on the CPU, from what loading or probing the CUDA backend said. */
static const char *cpu_reason(const char *err)
{
    if (strstr(err, "libcuda.so")) return "no CUDA driver";
    if (!strncmp(err, "no CUDA backend", 15)) return "this build has no CUDA backend";
    if (strstr(err, "CUDA program")) return "the plan has no CUDA program";
    return err;
}

int rt_device_choose(RtDevice *d, RtDeviceKind want, int debug, const Plan *p, int local_rank, const char *who)
{
    char err[1024] = "", why[1024];
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "cpu");
    d->ops = rt_backend_cpu();
    if (want == RT_DEVICE_CPU) return 0;
    if (debug) {  // auto: the debug modes check the CPU backend's buffers
        snprintf(d->name, sizeof d->name, "cpu (--debug-* checks the CPU backend)");
        return 0;
    }
    const RtBackendOps *ops = rt_backend_load_cuda(err, sizeof err);
    int rc = ops ? 0 : -1;
    if (ops && ops->probe(err, sizeof err)) {
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, sizeof err, "no CUDA GPU: %.1000s", why);
        rc = -1;
    }
    if (!rc) rc = rt_backend_plan_has_cuda(p, err, sizeof err);
    /* A plan too large for the GPU is an error before anything is built, under auto too
     * (the CPU would not be what the user compiled for). */
    char fit[1024] = "";
    int too_big = !rc && ops->check_fit && ops->check_fit(p, local_rank, fit, sizeof fit);
    if (too_big) fprintf(stderr, "%s: --device %s: %s\n", who, want == RT_DEVICE_CUDA ? "cuda" : "auto", fit);
    if (rt_comm_agree(too_big ? 1 : 0)) return 1;  // one rank's device too small ends every rank
    if (!rt_comm_agree(rc ? 1 : 0)) {  // every rank runs on the same kind of device
        d->ops = ops;
        return 0;
    }
    if (want == RT_DEVICE_CUDA) {
        if (rc) fprintf(stderr, "%s: --device cuda: %s\n", who, err);
        return 1;
    }
    snprintf(d->name, sizeof d->name, "cpu (%s)", rc ? cpu_reason(err) : "another rank has no CUDA GPU");
    return 0;
}

/* The watchdog's question to the device (rt_watchdog_device). */
static int device_hung(void *ctx, char *msg, size_t n)
{
    RtDevice *d = ctx;
    return d->ops->hung(d->b, msg, n);
}

/* The backend's way to run an op of the host space (offload's update) on the mirror. */
static int run_host_op(void *ctx, int32_t k) { return rt_exec_run_host_op(ctx, k); }

int rt_device_open(RtDevice *d, const Exec *e, const RtRanks *rk, int tf32, int trace, const int32_t *report,
                   int n_report)
{
    char err[2048];
    const Plan *p = rt_exec_plan(e);
    RtBackendOptions o = {.plan = p, .host_arena = rt_exec_arena(e),
                          .host_bytes = rt_exec_held_bytes(e, PLAN_PLACE_DEVICE), .rank = rk->rank, .world = rk->world,
                          .stage = rt_exec_stage(e), .stages = rt_exec_stages(e), .local_rank = rk->local_rank, .tf32 = tf32, .exec = (Exec *)e,
                          .host_space = (void *)rt_exec_space(e, PLAN_PLACE_HOST),
                          .host_space_bytes = rt_exec_space_bytes(e, PLAN_PLACE_HOST), .host_op = run_host_op,
                          .host_ctx = (Exec *)e, .trace = trace};
    d->up = malloc(sizeof *d->up * ((size_t)p->n_tensors + 1));
    d->down = malloc(sizeof *d->down * ((size_t)n_report + 1));
    if (!d->up || !d->down) {
        fprintf(stderr, "[rank %d] fsexec: out of memory\n", rk->rank);
        return -1;
    }
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].role == PLAN_ROLE_INPUT) d->up[d->n_up++] = i;
    for (int i = 0; i < n_report; i++)
        if (report[i] >= 0) d->down[d->n_down++] = report[i];
    if (!(d->b = d->ops->create(&o, err, sizeof err))) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    RtBackendInfo in;
    d->ops->info(d->b, &in);
    if (!rt_device_is_cpu(d)) snprintf(d->name, sizeof d->name, "%s", in.device);  // the CPU's says why it is the CPU
    if (d->ops->hung) rt_watchdog_device(device_hung, d);
    return 0;
}

int rt_device_run_ops(RtDevice *d, int32_t from, int32_t to) { return d->ops->run_ops(d->b, from, to); }

int rt_device_run_step(RtDevice *d, int graph) { return d->ops->run_step(d->b, graph); }

int rt_device_run_step_timed(RtDevice *d, RtSpan *spans) { return d->ops->run_step_timed(d->b, spans); }

int rt_device_is_cpu(const RtDevice *d) { return d->ops == rt_backend_cpu(); }

void rt_device_copied(const RtDevice *d, const Exec *e, int64_t *to_host, int64_t *to_device)
{
    if (d->ops->copied) d->ops->copied(d->b, to_host, to_device);
    else rt_exec_copied(e, to_host, to_device);
}

int rt_device_move(RtDevice *d, Exec *e, int up, const int32_t *ids, int n)
{
    const Plan *p = rt_exec_plan(e);
    for (int i = 0; i < n; i++) {  // the CPU backend's moves are nothing
        if (p->tensors[ids[i]].place == PLAN_PLACE_HOST) continue;  // offload's: the mirror holds it, not the device
        void *host = rt_exec_data(e, ids[i]);
        if (up ? d->ops->upload(d->b, ids[i], host) : d->ops->download(d->b, ids[i], host)) return -1;
    }
    return 0;
}

int rt_device_step_in(RtDevice *d, Exec *e, int64_t step)
{
    rt_exec_set_step(e, step);  // the CPU backend runs this step number too
    return rt_device_move(d, e, 1, d->up, d->n_up);
}

int rt_device_step_out(RtDevice *d, Exec *e) { return rt_device_move(d, e, 0, d->down, d->n_down); }

int rt_device_download_roles(RtDevice *d, Exec *e, unsigned roles, int views)
{
    const Plan *p = rt_exec_plan(e);
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (((roles >> t->role) & 1) && (views || t->alias == PLAN_NONE) && rt_device_move(d, e, 0, &i, 1)) return -1;
    }
    return 0;
}

void rt_device_report(const RtDevice *d, FILE *out)
{
    if (rt_device_is_cpu(d)) return;
    RtBackendInfo in;
    d->ops->info(d->b, &in);
    char a[32], pl[32], bl[32], ws[32], cm[32], cx[32], md[32], used[32], tot[32];
    fprintf(out, "fsexec: cuda memory: arena %s (planned %s), cuBLAS %s (workspace %s), NCCL %s, context %s, "
            "kernels %s; device %s of %s in use\n", report_bytes(in.arena, a, sizeof a),
            report_bytes(in.arena_planned, pl, sizeof pl), report_bytes(in.blas, bl, sizeof bl),
            report_bytes(in.blas_workspace, ws, sizeof ws), report_bytes(in.comm, cm, sizeof cm),
            report_bytes(in.context, cx, sizeof cx), report_bytes(in.module, md, sizeof md),
            report_bytes(in.used, used, sizeof used), report_bytes(in.total, tot, sizeof tot));
    fprintf(out, "fsexec: cuda kernels: %s\n", in.jit);
}

void rt_device_print_error(const RtDevice *d, int64_t step)
{
    if (step > 0)
        fprintf(stderr, "%s (step %lld)\n", d->ops->error(d->b), (long long)step);
    else
        fprintf(stderr, "%s\n", d->ops->error(d->b));
}

void rt_device_close(RtDevice *d)
{
    if (d->ops && d->ops->hung) rt_watchdog_device(NULL, NULL);
    if (d->b) d->ops->destroy(d->b);
    free(d->up);
    free(d->down);
    memset(d, 0, sizeof *d);
}
