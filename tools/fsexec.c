/* tools/fsexec.c: the runtime's command line. Thin: parse flags (fsexec_args.c), then one
 * mode: --inspect and --export here, --sample (fsexec_sample.c), --nproc's launch
 * (fsexec_world.c), else the run (fsexec_run.c: load the plan, every check being
 * plan_read's, set up the executor, the data and the reporting, run the steps or
 * --predict's evaluation program: runtime/predict.c, save what was asked). The start line
 * and notes are fsexec_report.c's; what these files share is tools/fsexec.h. Exit status:
 * 0 done, 1 an error (a bad plan, an unreadable file, a loss that is not finite), 2 a
 * usage error or something this build cannot do.
 *
 * The step loop is the runtime's (runtime/step.c), and the backend that runs it is
 * chosen behind one table (runtime/device.c): the CPU's, or with --device cuda (or auto,
 * on a machine with a GPU) the CUDA backend (runtime/backend.h, loaded with dlopen),
 * which runs the steps on a device copy of the CPU Exec's arena (the host mirror: init,
 * data, weights files).
 *
 * Ranks: a plan for a world of N runs as N processes started by mpirun, srun, or
 * `fsexec --nproc N` (which checks N against the plan's world, then runs mpirun on this
 * binary as its child, relaying a Ctrl-C to the ranks: runtime/launch.c). The world is
 * the plan's stages x data-parallel ranks (rt_plan_layout): rank r runs stage r / dp's
 * program (plan_extract_program) as data-parallel index r % dp, and everything after (the
 * executor, data, weights, the step loop) sees that one-program plan; a plan of one stage
 * runs as it is. One rank reports: rank 0, or in a pipeline the first rank of the last
 * stage (it holds the logits); it prints progress and writes the log; the first rank of
 * each stage writes its weights (the paths are checked on every rank before anything runs,
 * so a bad one fails at once, not after training). Step lines go to stdout (on a terminal,
 * a bar on stderr: runtime/progress.c); everything else (the start line, notes, errors) to
 * stderr. Errors carry `[rank r]` (`[rank r, stage s]`); a world-size mismatch is reported
 * by every rank before MPI starts; any other error on one rank ends every rank
 * (MPI_Abort), except those all ranks see alike (a non-finite global loss, a failed save
 * or load: agreed, then a clean exit 1).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <unistd.h>

#include "fsexec.h"

/* Who speaks in messages: "fsexec", or "[rank r] fsexec" in a world of several ranks
 * ("[rank r, stage s] fsexec" in a pipeline). */
char who[80] = "fsexec";
int my_rank, my_world = 1;
RtLayout layout = {1, 1, 1, 1};  // the plan's stages x data-parallel ranks

/* A local error: with several ranks it ends them all (the others may be waiting for this
 * one in a collective); alone, the caller returns status rc. */
int local_error(int rc)
{
    if (my_world > 1) rt_comm_abort(rc);
    return rc;
}

int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "fsexec: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see fsexec --help)\n");
    return 2;
}

Plan *load(const char *path)
{
    char err[512];
    Plan *p = plan_read(path, err, sizeof err);
    if (!p) fprintf(stderr, "%s: %s: %s\n", who, path, err);
    return p;
}

static int inspect(const char *path)
{
    Plan *p = load(path);
    if (!p) return 1;
    printf("file          %s\n", path);
    rt_inspect(p, stdout);
    plan_free(p);
    return 0;  // a failed write to stdout is close_stdout's
}

/* fsexec --export CKPT FILE: 0, or 1 after a message. */
static int export_checkpoint(const char *from, const char *out, RtWeightsFormat format)
{
    char err[1024];
    double t0 = rt_now();
    RtCheckpoint *c = rt_checkpoint_open(from, err, sizeof err);
    int64_t buffer = 0;
    int rc = !c || rt_checkpoint_export(c, out, format, &buffer, err, sizeof err);
    if (rc) fprintf(stderr, "fsexec: --export: %s\n", err);
    else
        fprintf(stderr, "fsexec: exported the params of %s (step %" PRId64 ") to %s (%s names) in %.2f s, %s a %.0f "
                "MiB buffer\n", rt_checkpoint_dir(c), rt_checkpoint_step(c), out, rt_weights_format_name(format),
                rt_now() - t0, format == RT_WEIGHTS_FSEXEC ? "through" : "holding the params in",
                (double)buffer / (1 << 20));
    rt_checkpoint_close(c);
    return rc ? 1 : 0;
}

/* Registered first, so it runs last at exit: a failed write to stdout (a full disk) is an
 * error whatever the command printed, --help included. */
static void close_stdout(void)
{
    char err[128];
    if (plan_stdout_close(err, sizeof err)) {
        fprintf(stderr, "fsexec: %s\n", err);
        _exit(1);
    }
}

int main(int argc, char **argv)
{
    plan_stdout_open();
    atexit(close_stdout);
    Flags f = {0};
    int rc = parse_args(argc, argv, &f);
    if (rc) return rc;
    if (f.inspect) rc = inspect(f.inspect);
    else if (f.export_from) rc = export_checkpoint(f.export_from, f.plan, f.save_format);
    else if (check_outputs(&f)) rc = 1;
    else if (f.sample && f.nproc > 1) rc = usage_error("%s", "--sample runs in one process; drop --nproc");
    else if (f.nproc > 1) rc = launch(&f, argc, argv);
    else rc = f.sample ? sample(&f) : run(&f);
    rt_weights_format_free(f.load_format);
    rt_weights_format_free(f.save_format);
    return rc;
}
