/* runtime/rank.c: which rank this process is, read from the launcher's environment, and
 * the command line that starts N local ranks (`fsexec --nproc N`).
 *
 * Launchers, in the order they are believed (the first whose variables are set wins):
 *   Open MPI mpirun      OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
 *   MPICH / Intel hydra  PMI_RANK, PMI_SIZE (MPI_LOCALRANKID, MPI_LOCALNRANKS)
 *   Slurm srun           SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS),
 *                        SLURM_LOCALID; only inside a job step (SLURM_STEP_ID set): a
 *                        batch script itself has SLURM_PROCID=0 and the job's task count,
 *                        but it is one process, not a rank of N
 *   PMIx alone           PMIX_RANK; the size comes from MPI once it is up (world 0 here)
 *   torchrun style       RANK, WORLD_SIZE, LOCAL_RANK (MASTER_ADDR, MASTER_PORT)
 * No variables: one rank of one. CPU ranks talk through MPI, and MPI needs a launcher
 * that wires its processes together; a torchrun-style world of more than one rank has
 * none, so it is refused with a message that says what to run instead (bootstrapping
 * an MPI world over TCP from MASTER_PORT with MPI_Open_port / MPI_Comm_connect needs an
 * ompi-server in Open MPI 4 and does not work between singletons).
 *
 * Pure functions of a getenv-like callback, so tests can hand in any environment.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

static const char *const LAUNCH_NAMES[RT_LAUNCH_COUNT] = {
    "none", "mpirun (Open MPI)", "PMI (MPICH/hydra)", "srun (Slurm)", "PMIx", "torchrun-style RANK/WORLD_SIZE",
};

const char *rt_launch_name(RtLaunch l) { return l >= 0 && l < RT_LAUNCH_COUNT ? LAUNCH_NAMES[l] : "?"; }

static const char *var(RtGetenv get, void *ctx, const char *name)
{
    const char *v = get(ctx, name);
    return v && *v ? v : NULL;
}

/* A whole decimal integer in [lo, 1 << 24]; -1 with a message naming the variable. */
static int int_var(RtGetenv get, void *ctx, const char *name, int lo, int *out, char *err, size_t errlen)
{
    const char *s = var(get, ctx, name);
    if (!s) return plan_fail(err, errlen, "%s is not set", name);
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > (1L << 24))
        return plan_fail(err, errlen, "%s is '%s': expected an integer of at least %d", name, s, lo);
    *out = (int)v;
    return 0;
}

/* An optional integer: def when unset or not a number (local ranks are advisory). */
static int opt_int(RtGetenv get, void *ctx, const char *name, int def)
{
    const char *s = var(get, ctx, name);
    if (!s) return def;
    char *end;
    long v = strtol(s, &end, 10);
    return end == s || *end || v < 0 || v > (1L << 24) ? def : (int)v;
}

/* rank and world from the variables `rank_var`, `world_var`; checks rank < world. */
static int pair(RtGetenv get, void *ctx, const char *rank_var, const char *world_var, RtRanks *r, char *err,
                size_t errlen)
{
    if (int_var(get, ctx, rank_var, 0, &r->rank, err, errlen) ||
        int_var(get, ctx, world_var, 1, &r->world, err, errlen))
        return -1;
    if (r->rank >= r->world)
        return plan_fail(err, errlen, "%s=%d is not below %s=%d", rank_var, r->rank, world_var, r->world);
    return 0;
}

int rt_ranks_discover(RtGetenv get, void *ctx, RtRanks *r, char *err, size_t errlen)
{
    *r = (RtRanks){.launch = RT_LAUNCH_NONE, .rank = 0, .world = 1, .local_rank = 0, .local_world = 1};
    if (var(get, ctx, "OMPI_COMM_WORLD_RANK") || var(get, ctx, "OMPI_COMM_WORLD_SIZE")) {
        r->launch = RT_LAUNCH_OMPI;
        if (pair(get, ctx, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", r, err, errlen)) return -1;
        r->local_rank = opt_int(get, ctx, "OMPI_COMM_WORLD_LOCAL_RANK", -1);
        r->local_world = opt_int(get, ctx, "OMPI_COMM_WORLD_LOCAL_SIZE", -1);
        return 0;
    }
    if (var(get, ctx, "PMI_RANK") && var(get, ctx, "PMI_SIZE")) {
        r->launch = RT_LAUNCH_PMI;
        if (pair(get, ctx, "PMI_RANK", "PMI_SIZE", r, err, errlen)) return -1;
        r->local_rank = opt_int(get, ctx, "MPI_LOCALRANKID", -1);
        r->local_world = opt_int(get, ctx, "MPI_LOCALNRANKS", -1);
        return 0;
    }
    if (var(get, ctx, "SLURM_PROCID") && (var(get, ctx, "SLURM_STEP_ID") || var(get, ctx, "SLURM_STEPID"))) {
        r->launch = RT_LAUNCH_SLURM;
        const char *n = var(get, ctx, "SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
        if (pair(get, ctx, "SLURM_PROCID", n, r, err, errlen)) return -1;
        r->local_rank = opt_int(get, ctx, "SLURM_LOCALID", -1);
        r->local_world = -1;  // SLURM_TASKS_PER_NODE is a list ("2(x3),1"): MPI tells
        return 0;
    }
    if (var(get, ctx, "PMIX_RANK")) {
        r->launch = RT_LAUNCH_PMIX;
        if (int_var(get, ctx, "PMIX_RANK", 0, &r->rank, err, errlen)) return -1;
        r->world = 0;  // PMIx keeps the size to itself: MPI_Comm_size, once MPI is up
        r->local_rank = r->local_world = -1;
        return 0;
    }
    if (var(get, ctx, "RANK") || var(get, ctx, "WORLD_SIZE")) {
        r->launch = RT_LAUNCH_TORCHRUN;
        if (pair(get, ctx, "RANK", "WORLD_SIZE", r, err, errlen)) return -1;
        r->local_rank = opt_int(get, ctx, "LOCAL_RANK", -1);
        r->local_world = opt_int(get, ctx, "LOCAL_WORLD_SIZE", -1);
        if (r->world > 1)
            return plan_fail(err, errlen,
                           "RANK=%d and WORLD_SIZE=%d are set (torchrun style), but fsexec's CPU ranks talk through "
                           "MPI, and MPI needs an MPI launcher to connect them (this build cannot bootstrap a world "
                           "over MASTER_ADDR/MASTER_PORT): start the ranks with `mpirun -np %d fsexec ...`, "
                           "`srun --mpi=pmix -n %d fsexec ...`, or `fsexec --nproc %d ...`",
                           r->rank, r->world, r->world, r->world, r->world);
        return 0;
    }
    return 0;
}

static const char *real_getenv(void *ctx, const char *name)
{
    (void)ctx;
    return getenv(name);
}

int rt_ranks_from_env(RtRanks *r, char *err, size_t errlen) { return rt_ranks_discover(real_getenv, NULL, r, err, errlen); }

int rt_launch_argv(const char *mpirun, const char *exe, int nproc, int as_root, char *const *args, int n_args,
                   const char **out, int cap, char *np_buf, size_t np_len)
{
    static const char *const fixed[] = {"--oversubscribe", "--bind-to", "none", "--stdin", "none",
                                        "-x", "OMP_NUM_THREADS", "-x", "FSEXEC_LAUNCHER"};
    int nfixed = (int)(sizeof fixed / sizeof *fixed), n = 0;
    if (cap < 3 + nfixed + 1 + 1 + n_args + 1) return -1;
    snprintf(np_buf, np_len, "%d", nproc);
    out[n++] = mpirun;
    out[n++] = "-np";
    out[n++] = np_buf;
    for (int i = 0; i < nfixed; i++) out[n++] = fixed[i];
    if (as_root) out[n++] = "--allow-run-as-root";
    out[n++] = exe;
    for (int i = 0; i < n_args; i++) out[n++] = args[i];
    out[n] = NULL;
    return n;
}

/* ---- the plan's ranks: stages x data-parallel ranks --------------------------------- */

int rt_plan_layout(const Plan *p, RtLayout *l, char *err, size_t errlen)
{
    if (p->n_programs < 1) {  // no memory plan: the executor refuses it, with its own message
        int64_t w = plan_meta_int(p, "world", 1);
        *l = (RtLayout){.stages = 1, .dp = w >= 1 && w <= RT_MAX_WORLD ? (int)w : 1};
        l->world = l->shard = l->dp;
        return 0;
    }
    int dp = p->programs[0].dp_world;
    for (int32_t k = 1; k < p->n_programs; k++)
        if (p->programs[k].dp_world != dp)
            return plan_fail(err, errlen, "stage %d has %d data-parallel ranks, but stage 0 has %d; every stage of a "
                             "plan has the same (recompile it)", k, p->programs[k].dp_world, dp);
    if ((int64_t)p->n_programs * dp > RT_MAX_WORLD)
        return plan_fail(err, errlen, "%d stages x %d data-parallel ranks is more than %d ranks", p->n_programs, dp,
                         RT_MAX_WORLD);
    *l = (RtLayout){.stages = p->n_programs, .dp = dp, .world = p->n_programs * dp, .shard = (int)plan_shard_group(p, dp)};
    return 0;
}

const char *rt_layout_str(const RtLayout *l, char *buf, size_t n)
{
    if (l->stages == 1) snprintf(buf, n, "world %d", l->world);
    else snprintf(buf, n, "%d stages x %d data-parallel rank%s = world %d", l->stages, l->dp, l->dp == 1 ? "" : "s",
                  l->world);
    return buf;
}
