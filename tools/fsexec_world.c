/* tools/fsexec_world.c: the ranks. join_world finds this process's rank (mpirun, srun or
 * --nproc's environment), starts MPI, checks the plan's world and what a pipeline cannot
 * do, splits the world into the plan's stages x data-parallel ranks and names the rank in
 * `who`; launch is --nproc N: the same command as N ranks under mpirun, after checking N
 * against the plan. Invariants: a world that does not match the plan is reported by every
 * rank, agreed before any exits, and runs nothing; ranks on one machine share its cores
 * unless --threads or OMP_NUM_THREADS says otherwise. Called by run (fsexec_run.c) and
 * main (tools/fsexec.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsexec.h"

/* The threads of each of n ranks sharing this machine: its cores split evenly, at least one. */
static long cores_each(long n)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores / n > 1 ? cores / n : 1;
}

/* What the plan needs started, for messages: "plan compiled for world 2", "the plan has 2
 * stages x 2 data-parallel ranks = world 4". */
static const char *needs(const RtLayout *l, char *buf, size_t n)
{
    char what[96];
    if (l->stages == 1) snprintf(buf, n, "plan compiled for world %d", l->world);
    else snprintf(buf, n, "the plan has %s", rt_layout_str(l, what, sizeof what));
    return buf;
}

/* The plan's world against the ranks started; 0, or 1 after a message (every rank says it). */
static int check_world(const Flags *f, const RtLayout *l, int ranks)
{
    int world = l->world;
    if (world == ranks) return 0;
    char hint[256] = "", need[128];
    if (world > 1 && ranks == 1)
        snprintf(hint, sizeof hint, " (start %d: mpirun -np %d fsexec ..., srun --mpi=pmix -n %d fsexec ..., or "
                 "fsexec --nproc %d ...)", world, world, world, world);
    else if (l->stages == 1)
        snprintf(hint, sizeof hint, " (recompile with fsc --world %d, or start %d)", ranks, world);
    else
        snprintf(hint, sizeof hint, " (start %d)", world);
    fprintf(stderr, "%s: %s: %s, but %d rank%s started%s\n", who, f->plan, needs(l, need, sizeof need), ranks,
            ranks == 1 ? "" : "s", hint);
    return 1;
}

/* What a pipeline cannot do (yet); 0, or a usage status after a message on rank 0. */
static int check_pipeline(const Flags *f, int rank)
{
    const char *flag = f->save_grads ? "--save-grads" : f->overflow_at ? "--debug-overflow-at"
                       : f->debug_guard ? "--debug-guard" : NULL;
    if (layout.stages == 1 || !flag) return 0;
    if (rank == 0)
        fprintf(stderr, "%s: %s runs plans of one pipeline stage only; this one has %d\n", who, flag, layout.stages);
    return 2;
}

/* Finds this process's rank, starts MPI for a world of several, checks the plan's world
 * and splits it into the plan's stages; 0, or an exit status after a message. A mismatch
 * is reported by every rank, and they agree before any exits: mpirun ends the job at the
 * first non-zero exit, which would cut the others short. */
int join_world(const Flags *f, const Plan *p, RtRanks *rk)
{
    char err[512];
    if (rt_ranks_from_env(rk, err, sizeof err)) {
        fprintf(stderr, "fsexec: %s\n", err);
        return 1;
    }
    if (rk->world != 1) snprintf(who, sizeof who, "[rank %d] fsexec", rk->rank);
    if (rt_comm_init(rk, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", who, err);
        rt_comm_abort(1);
    }
    if (rk->world != 1) snprintf(who, sizeof who, "[rank %d] fsexec", rk->rank);
    int rc = 0;
    if (rt_plan_layout(p, &layout, err, sizeof err)) {
        fprintf(stderr, "%s: %s: %s\n", who, f->plan, err);
        rc = 1;
    }
    rc = rc ? rc : check_world(f, &layout, rk->world);
    if (!rc && f->save_grads && layout.world > 1 && layout.stages == 1) {
        if (rk->rank == 0)
            fprintf(stderr, "%s: --save-grads is supported for world 1 only (with more ranks the gradients are "
                    "reduced and sharded); run a plan compiled for --world 1\n", who);
        rc = 2;
    }
    rc = rc ? rc : check_pipeline(f, rk->rank);
    /* A pipeline that could deadlock does not start. */
    if (!rc && layout.stages > 1 && plan_check_p2p(p, err, sizeof err)) {
        fprintf(stderr, "%s: %s: %s\n", who, f->plan, err);
        rc = 1;
    }
    if ((rc = rt_comm_agree(rc))) return rc;
    if (rt_comm_layout(layout.stages, layout.dp, layout.shard, err, sizeof err)) {  // every rank alike
        fprintf(stderr, "%s: %s\n", who, err);
        return 1;
    }
    if (layout.stages > 1) snprintf(who, sizeof who, "[%s] fsexec", rt_comm_who());
    my_rank = rk->rank, my_world = rk->world;
    if (my_world > 1 && rt_watchdog_start((double)f->timeout, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", who, err);
        return 1;
    }
    rt_watchdog_pipeline(p, layout.dp);
    /* Ranks that share a machine share its cores, unless told otherwise. */
    if (!f->threads && !getenv("OMP_NUM_THREADS") && rk->local_world > 1)
        rt_set_threads((int)cores_each(rk->local_world));
    return 0;
}

/* --nproc N against the plan's world, before any rank starts; 0, or 1 after a message. */
static int check_nproc(const Flags *f)
{
    Plan *p = load(f->plan);
    if (!p) return 1;
    RtLayout l;
    char err[512], need[128], fix[64] = "run it without --nproc", again[64] = "";
    int rc = rt_plan_layout(p, &l, err, sizeof err);
    plan_free(p);
    if (rc) {
        fprintf(stderr, "fsexec: %s: %s\n", f->plan, err);
        return 1;
    }
    if (l.world == f->nproc) return 0;
    if (l.world > 1) snprintf(fix, sizeof fix, "use --nproc %d", l.world);
    if (l.stages == 1) snprintf(again, sizeof again, ", or recompile with fsc --world %" PRId64, f->nproc);
    fprintf(stderr, "fsexec: %s: %s, but --nproc asks for %" PRId64 " ranks; none started (%s%s)\n", f->plan,
            needs(&l, need, sizeof need), f->nproc, fix, again);
    return 1;
}

/* fsexec --nproc N: the same command as N ranks under mpirun; its exit status. */
int launch(const Flags *f, int argc, char **argv)
{
    RtRanks rk;
    char err[512], exe[PATH_MAX], threads[32], np[32];
    if (rt_ranks_from_env(&rk, err, sizeof err) || rk.world != 1) {
        fprintf(stderr, "fsexec: --nproc starts ranks, but this process already is rank %d of %d (%s); drop "
                "--nproc\n", rk.rank, rk.world, rt_launch_name(rk.launch));
        return 2;
    }
    if (check_nproc(f)) return 1;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n < 0) {
        fprintf(stderr, "fsexec: --nproc: cannot find this program's path: %s\n", strerror(errno));
        return 1;
    }
    exe[n] = 0;
    const char *mpirun = getenv("FSEXEC_MPIRUN");
    if (!mpirun || !*mpirun) mpirun = "mpirun";
    if (!getenv("OMP_NUM_THREADS")) {
        snprintf(threads, sizeof threads, "%ld", cores_each((long)f->nproc));
        setenv("OMP_NUM_THREADS", threads, 1);
    }
    char **args = malloc(sizeof *args * (size_t)argc);
    const char **av = malloc(sizeof *av * (size_t)(argc + 20));
    if (!args || !av) {
        fprintf(stderr, "fsexec: out of memory\n");
        return 1;
    }
    int n_args = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--nproc")) i++;
        else if (strncmp(argv[i], "--nproc=", 8)) args[n_args++] = argv[i];
    }
    rt_launch_argv(mpirun, exe, (int)f->nproc, geteuid() == 0, args, n_args, av, argc + 20, np, sizeof np);
    int rc = rt_launch_run(av, err, sizeof err);
    if (rc < 0) fprintf(stderr, "fsexec: --nproc %" PRId64 ": %s\n", f->nproc, err);
    free(args);
    free(av);
    return rc < 0 ? 1 : rc;
}
