/* tests/unit/test_comm.c: what the multi-rank runtime decides without MPI running:
 * rank discovery from every launcher's variables, the mpirun command of --nproc, the
 * hazard test and the in-place decisions of collectives, flat layouts (a sharded
 * storage's init equals the same slice of the unsharded tensors for every rank, world
 * and padding; which ranges each rank owns), a rank's rows of the global batch, and
 * hand-made world-1 plans with flat storage, views and collectives run by the executor
 * (init, consolidated save and load, layout checks, world mismatch); point-to-point ops
 * as bound for MPI, a pipeline stage's weights file names, and a stage's params read
 * from a file of the whole model. The MPI side itself runs under mpirun in tests/mpi/.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime.h"
#include "tmpdir.h"

/* ---- rank discovery ------------------------------------------------------------------ */

/* A fake environment: "NAME=VALUE" strings, NULL-terminated. */
static const char *fake_get(void *ctx, const char *name)
{
    size_t n = strlen(name);
    for (const char *const *e = ctx; *e; e++)
        if (!strncmp(*e, name, n) && (*e)[n] == '=') return *e + n + 1;
    return NULL;
}

static int discover(const char *const *env, RtRanks *r, char *err, size_t errlen)
{
    return rt_ranks_discover(fake_get, (void *)env, r, err, errlen);
}

Test(ranks, none_is_one_rank)
{
    const char *env[] = {"HOME=/root", NULL};
    RtRanks r;
    char err[512];
    cr_assert_eq(discover(env, &r, err, sizeof err), 0);
    cr_assert(r.launch == RT_LAUNCH_NONE && r.rank == 0 && r.world == 1);
}

Test(ranks, open_mpi)
{
    const char *env[] = {"OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=0",
                         "OMPI_COMM_WORLD_LOCAL_SIZE=2", "RANK=9", "WORLD_SIZE=12", NULL};
    RtRanks r;
    char err[512];
    cr_assert_eq(discover(env, &r, err, sizeof err), 0, "%s", err);
    cr_assert(r.launch == RT_LAUNCH_OMPI && r.rank == 2 && r.world == 4 && r.local_rank == 0 && r.local_world == 2);
}

Test(ranks, mpich_pmi)
{
    const char *env[] = {"PMI_RANK=1", "PMI_SIZE=3", NULL};
    RtRanks r;
    char err[512];
    cr_assert_eq(discover(env, &r, err, sizeof err), 0, "%s", err);
    cr_assert(r.launch == RT_LAUNCH_PMI && r.rank == 1 && r.world == 3);
}

Test(ranks, slurm_step)
{
    const char *env[] = {"SLURM_PROCID=5", "SLURM_NTASKS=16", "SLURM_STEP_NUM_TASKS=8", "SLURM_STEP_ID=0",
                         "SLURM_LOCALID=1", "PMIX_RANK=5", NULL};
    RtRanks r;
    char err[512];
    cr_assert_eq(discover(env, &r, err, sizeof err), 0, "%s", err);
    cr_assert(r.launch == RT_LAUNCH_SLURM && r.rank == 5 && r.world == 8 && r.local_rank == 1, "world %d", r.world);
}

Test(ranks, slurm_batch_script_is_not_a_rank)
{
    /* sbatch's own shell: SLURM_PROCID and the job's task count, but no job step. */
    const char *env[] = {"SLURM_PROCID=0", "SLURM_NTASKS=4", NULL};
    RtRanks r;
    char err[512];
    cr_assert_eq(discover(env, &r, err, sizeof err), 0, "%s", err);
    cr_assert(r.launch == RT_LAUNCH_NONE && r.world == 1);
}

Test(ranks, pmix_alone_leaves_the_world_to_mpi)
{
    const char *env[] = {"PMIX_RANK=3", NULL};
    RtRanks r;
    char err[512];
    cr_assert_eq(discover(env, &r, err, sizeof err), 0, "%s", err);
    cr_assert(r.launch == RT_LAUNCH_PMIX && r.rank == 3 && r.world == 0);
}

Test(ranks, torchrun_world_of_one_runs)
{
    const char *env[] = {"RANK=0", "WORLD_SIZE=1", "LOCAL_RANK=0", "MASTER_ADDR=localhost", "MASTER_PORT=29500", NULL};
    RtRanks r;
    char err[512];
    cr_assert_eq(discover(env, &r, err, sizeof err), 0, "%s", err);
    cr_assert(r.launch == RT_LAUNCH_TORCHRUN && r.world == 1);
}

Test(ranks, torchrun_world_is_refused_with_what_to_run)
{
    const char *env[] = {"RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=1", "MASTER_ADDR=localhost", "MASTER_PORT=29500", NULL};
    RtRanks r;
    char err[512];
    cr_assert_eq(discover(env, &r, err, sizeof err), -1);
    cr_assert(strstr(err, "mpirun -np 4") && strstr(err, "srun --mpi=pmix -n 4") && strstr(err, "--nproc 4"), "%s", err);
}

Test(ranks, bad_values_name_the_variable)
{
    char err[512];
    RtRanks r;
    const char *a[] = {"OMPI_COMM_WORLD_RANK=4", "OMPI_COMM_WORLD_SIZE=4", NULL};
    cr_assert_eq(discover(a, &r, err, sizeof err), -1);
    cr_assert(strstr(err, "OMPI_COMM_WORLD_RANK=4 is not below OMPI_COMM_WORLD_SIZE=4"), "%s", err);
    const char *b[] = {"OMPI_COMM_WORLD_RANK=x", "OMPI_COMM_WORLD_SIZE=4", NULL};
    cr_assert_eq(discover(b, &r, err, sizeof err), -1);
    cr_assert(strstr(err, "OMPI_COMM_WORLD_RANK is 'x'"), "%s", err);
    const char *c[] = {"OMPI_COMM_WORLD_RANK=0", NULL};
    cr_assert_eq(discover(c, &r, err, sizeof err), -1);
    cr_assert(strstr(err, "OMPI_COMM_WORLD_SIZE is not set"), "%s", err);
    const char *d[] = {"RANK=0", "WORLD_SIZE=0", NULL};
    cr_assert_eq(discover(d, &r, err, sizeof err), -1);
    cr_assert(strstr(err, "WORLD_SIZE is '0'"), "%s", err);
}

Test(ranks, nproc_runs_mpirun_on_this_program)
{
    char *args[] = {"gpt2.plan", "--steps", "5"};
    const char *av[32];
    char np[16];
    int n = rt_launch_argv("mpirun", "/usr/bin/fsexec", 4, 1, args, 3, av, 32, np, sizeof np);
    cr_assert_gt(n, 0);
    cr_assert_null(av[n]);
    char line[512] = "";
    for (int i = 0; i < n; i++) strcat(strcat(line, av[i]), " ");
    cr_assert(strstr(line, "mpirun -np 4 --oversubscribe") == line, "%s", line);
    cr_assert(strstr(line, "--allow-run-as-root /usr/bin/fsexec gpt2.plan --steps 5 "), "%s", line);
    cr_assert(strstr(line, "-x OMP_NUM_THREADS"), "%s", line);
    cr_assert(strstr(line, "-x FSEXEC_LAUNCHER"), "the ranks know the launcher relays signals: %s", line);
    cr_assert(strstr(line, "--stdin none"), "mpirun runs in a background process group: %s", line);
    n = rt_launch_argv("mpirun", "/usr/bin/fsexec", 2, 0, args, 3, av, 32, np, sizeof np);
    for (int i = 0; i < n; i++) cr_assert(strcmp(av[i], "--allow-run-as-root"), "not as a user");
    cr_assert_eq(rt_launch_argv("mpirun", "x", 2, 0, args, 3, av, 8, np, sizeof np), -1);
}

/* ---- hazards and in-place collectives ---------------------------------------------------- */

Test(hazard, ranges_overlap)
{
    RtRange a[2] = {{100, 200}, {400, 450}};
    cr_assert(rt_ranges_overlap(a, 2, (RtRange[]){{150, 160}}, 1), "inside");
    cr_assert(rt_ranges_overlap(a, 2, (RtRange[]){{0, 101}}, 1), "first byte");
    cr_assert(rt_ranges_overlap(a, 2, (RtRange[]){{449, 1000}}, 1), "last byte");
    cr_assert(rt_ranges_overlap(a, 2, (RtRange[]){{0, 1000}}, 1), "containing");
    cr_assert_not(rt_ranges_overlap(a, 2, (RtRange[]){{200, 400}}, 1), "between, touching both ends");
    cr_assert_not(rt_ranges_overlap(a, 2, (RtRange[]){{0, 100}, {450, 460}}, 2), "adjacent");
    cr_assert_not(rt_ranges_overlap(a, 2, (RtRange[]){{150, 150}}, 1), "empty");
    cr_assert_not(rt_ranges_overlap(a, 2, NULL, 0), "nothing touched");
    cr_assert(rt_ranges_overlap(a, 2, (RtRange[]){{0, 10}, {420, 421}}, 2), "second of two");
}

Test(hazard, collective_in_place_decisions)
{
    float buf[64];
    RtColl c;
    char err[256];
    /* all_reduce: in place only when out is x. */
    cr_assert_eq(rt_coll_prepare(&c, RT_COLL_ALL_REDUCE, PLAN_DT_F32, buf, 8, buf, 8, 4, 1, 1, err, sizeof err), 0);
    cr_assert(c.in_place && c.avg && c.n == 8);
    cr_assert_eq(rt_coll_prepare(&c, RT_COLL_ALL_REDUCE, PLAN_DT_F32, buf, 8, buf + 8, 8, 4, 1, 0, err, sizeof err), 0);
    cr_assert(!c.in_place);
    cr_assert_eq(rt_coll_prepare(&c, RT_COLL_ALL_REDUCE, PLAN_DT_F32, buf, 8, buf + 4, 8, 4, 1, 0, err, sizeof err), -1);
    /* reduce_scatter [n * world] -> [n]: at the start, inside (moved after), apart. */
    cr_assert_eq(rt_coll_prepare(&c, RT_COLL_REDUCE_SCATTER, PLAN_DT_F32, buf, 12, buf, 4, 3, 0, 1, err, sizeof err), 0);
    cr_assert(c.in_place && !c.move_after && c.n == 4);
    cr_assert_eq(rt_coll_prepare(&c, RT_COLL_REDUCE_SCATTER, PLAN_DT_F32, buf, 12, buf + 8, 4, 3, 2, 1, err, sizeof err),
                 0);
    cr_assert(c.in_place && c.move_after);
    cr_assert_eq(rt_coll_prepare(&c, RT_COLL_REDUCE_SCATTER, PLAN_DT_F32, buf, 12, buf + 12, 4, 3, 2, 0, err, sizeof err),
                 0);
    cr_assert(!c.in_place);
    cr_assert_eq(rt_coll_prepare(&c, RT_COLL_REDUCE_SCATTER, PLAN_DT_F32, buf, 12, buf + 10, 4, 3, 2, 0, err, sizeof err),
                 -1, "sticks out of x");
    cr_assert_eq(rt_coll_prepare(&c, RT_COLL_REDUCE_SCATTER, PLAN_DT_F32, buf, 13, buf + 20, 4, 3, 0, 0, err, sizeof err),
                 -1, "does not split");
    /* all_gather [n] -> [n * world]: in place when x is this rank's slice. */
    cr_assert_eq(rt_coll_prepare(&c, RT_COLL_ALL_GATHER, PLAN_DT_F32, buf + 8, 4, buf, 16, 4, 2, 1, err, sizeof err), 0);
    cr_assert(c.in_place && !c.avg, "avg means nothing to a gather");
    cr_assert_eq(rt_coll_prepare(&c, RT_COLL_ALL_GATHER, PLAN_DT_F32, buf + 8, 4, buf, 16, 4, 1, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "rank 1") && strstr(err, "slice"), "%s", err);
    cr_assert_eq(rt_coll_prepare(&c, RT_COLL_ALL_GATHER, PLAN_DT_BF16, buf + 32, 4, buf, 16, 4, 1, 0, err, sizeof err), 0);
    /* 16-bit floats are reduced (comm.c's own MPI ops) and averaged; i32 is summed, never averaged. */
    cr_assert_eq(rt_coll_prepare(&c, RT_COLL_ALL_REDUCE, PLAN_DT_BF16, buf, 8, buf, 8, 4, 1, 1, err, sizeof err), 0);
    cr_assert(c.in_place && c.avg);
    cr_assert_eq(rt_coll_prepare(&c, RT_COLL_REDUCE_SCATTER, PLAN_DT_F16, buf, 8, buf, 2, 4, 1, 1, err, sizeof err), 0);
    cr_assert_eq(rt_coll_prepare(&c, RT_COLL_ALL_REDUCE, PLAN_DT_I32, buf, 8, buf, 8, 4, 1, 0, err, sizeof err), 0);
    cr_assert_eq(rt_coll_prepare(&c, RT_COLL_ALL_REDUCE, PLAN_DT_I32, buf, 8, buf, 8, 4, 1, 1, err, sizeof err), -1);
    cr_assert(strstr(err, "avg"), "%s", err);
    /* The bytes a pending collective holds: x and out. */
    rt_coll_prepare(&c, RT_COLL_REDUCE_SCATTER, PLAN_DT_F32, buf, 12, buf + 12, 4, 3, 0, 0, err, sizeof err);
    RtRange later = {(uintptr_t)(buf + 15), (uintptr_t)(buf + 17)};
    cr_assert(rt_ranges_overlap(c.range, 2, &later, 1));
    later = (RtRange){(uintptr_t)(buf + 16), (uintptr_t)(buf + 17)};
    cr_assert_not(rt_ranges_overlap(c.range, 2, &later, 1));
    cr_assert_eq(rt_coll_kind("reduce_scatter"), RT_COLL_REDUCE_SCATTER);
    cr_assert_eq(rt_coll_kind("matmul"), -1);
}

/* ---- flat layouts: hand-made plans ---------------------------------------------------------- */

typedef struct {
    const char *name;
    int64_t rows, cols;
    PlanInit init;
    double a, b;
} ParamSpec;

static const ParamSpec SPECS[] = {
    {"h.0.w", 3, 5, PLAN_INIT_NORMAL, 0.02, 0},
    {"h.0.b", 1, 7, PLAN_INIT_ONES, 0, 0},
    {"h.0.z", 1, 4, PLAN_INIT_ZEROS, 0, 0},
    {"h.0.u", 2, 3, PLAN_INIT_UNIFORM, -0.5, 0.5},
};
enum { N_SPECS = 4, FLAT_NUMEL = 15 + 7 + 4 + 6 };

static int32_t add_tensor(Plan *p, PlanTensor t, const char *name, int64_t rows, int64_t cols)
{
    t.name = name ? plan_intern(p, name) : PLAN_NONE;
    t.block = t.producer = t.tied_to = t.grad = PLAN_NONE;
    t.rank = rows > 1 ? 2 : 1;
    t.shape[0] = rows > 1 ? rows : cols;
    t.shape[1] = cols;
    int32_t id = plan_tensor_add(p, &t);
    cr_assert_geq(id, 0);
    return id;
}

/* A plan of one unit (unit 0, the params outside blocks, no blocks) for `world` ranks:
 * its storage (the whole padded buffer, or with `sharded` one rank's shard) at offset 0,
 * and the params of SPECS as views of it (sharded: of a gathered buffer after it). With
 * `strided`, a full storage also gets a rank's shard view (zero1/zero2). No ops. */
static Plan *flat_plan(int world, int sharded, int strided, int32_t *storage)
{
    Plan *p = plan_new();
    int64_t padded = (FLAT_NUMEL + world - 1) / world * world, shard = padded / world;
    int64_t numel = sharded ? shard : padded, bytes = (numel * 4 + 63) / 64 * 64;
    PlanTensor root = {.dtype = PLAN_DT_F32, .role = PLAN_ROLE_PARAM, .unit = 0, .sharded = (uint8_t)sharded,
                       .alias = PLAN_NONE};
    *storage = add_tensor(p, root, "flat_param", 1, numel);
    int32_t holder = *storage;
    int64_t top = bytes;
    if (sharded) {  // fsdp: the params are views of the gathered buffer
        PlanTensor g = {.dtype = PLAN_DT_F32, .role = PLAN_ROLE_GATHERED, .unit = 0, .offset = top, .alias = PLAN_NONE};
        holder = add_tensor(p, g, "flat_gathered", 1, padded);
        top += (padded * 4 + 63) / 64 * 64;
    } else if (strided) {
        PlanTensor v = {.dtype = PLAN_DT_F32, .role = PLAN_ROLE_PARAM, .unit = 0, .sharded = 1, .alias = *storage,
                        .rank_stride = shard * 4};
        add_tensor(p, v, NULL, 1, shard);
    }
    int64_t at = 0;
    for (int i = 0; i < N_SPECS; i++) {
        const ParamSpec *s = &SPECS[i];
        PlanTensor v = {.dtype = PLAN_DT_F32, .role = PLAN_ROLE_PARAM, .unit = 0, .alias = holder, .init = s->init,
                        .init_a = s->a, .init_b = s->b, .flat_offset = at, .offset = p->tensors[holder].offset + at * 4};
        add_tensor(p, v, s->name, s->rows, s->cols);
        at += s->rows * s->cols;
    }
    plan_meta_set_int(p, "world", world);
    plan_set_one_program(p, world, top, 0);
    char err[256];
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
    return p;
}

/* The unsharded tensors, back to back, then zero padding: what every layout must equal. */
static void whole_flat(uint64_t seed, float *out, int64_t padded)
{
    int64_t at = 0;
    for (int i = 0; i < N_SPECS; i++) {
        const ParamSpec *s = &SPECS[i];
        rt_init_param(s->name, seed, s->init, s->a, s->b, 0, s->rows * s->cols, out + at);
        at += s->rows * s->cols;
    }
    for (; at < padded; at++) out[at] = 0;
}

Test(flat, storage_and_params_are_told_apart)
{
    int32_t s;
    Plan *p = flat_plan(2, 0, 1, &s);
    cr_assert(rt_flat_is_storage(p, s));
    int params = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) params += rt_flat_is_param(&p->tensors[i], 0);
    cr_assert_eq(params, N_SPECS, "the shard view and the storage are not params");
    cr_assert_eq(rt_flat_length(p, s, 2), FLAT_NUMEL);
    plan_free(p);
    /* A param root of a plan made by hand with unit 0 left over is not a storage. */
    p = plan_new();
    PlanTensor t = {.dtype = PLAN_DT_F32, .role = PLAN_ROLE_PARAM, .init = PLAN_INIT_NORMAL, .init_a = 1,
                    .alias = PLAN_NONE};
    int32_t id = add_tensor(p, t, "w", 2, 2);
    cr_assert_not(rt_flat_is_storage(p, id));
    plan_free(p);
}

Test(flat, init_slices_equal_the_unsharded_tensors)
{
    enum { SEED = 77 };
    for (int world = 1; world <= 7; world++) {
        int64_t padded = (FLAT_NUMEL + world - 1) / world * world, shard = padded / world;
        float *whole = malloc(sizeof(float) * (size_t)padded), *got = malloc(sizeof(float) * (size_t)padded);
        whole_flat(SEED, whole, padded);
        char err[256];
        for (int sharded = 0; sharded <= 1; sharded++) {
            int32_t s;
            Plan *p = flat_plan(world, sharded, 0, &s);
            for (int rank = 0; rank < world; rank++) {
                int64_t first, count;
                rt_flat_held(&p->tensors[s], rank, &first, &count);
                cr_assert_eq(count, sharded ? shard : padded);
                cr_assert_eq(first, sharded ? rank * shard : 0);
                memset(got, 0xff, sizeof(float) * (size_t)padded);
                cr_assert_eq(rt_flat_init(p, s, rank, SEED, got, err, sizeof err), 0, "%s", err);
                cr_assert_eq(memcmp(got, whole + first, sizeof(float) * (size_t)count), 0,
                             "world %d rank %d sharded %d", world, rank, sharded);
            }
            plan_free(p);
        }
        free(whole);
        free(got);
    }
}

Test(flat, who_owns_what)
{
    int32_t s;
    RtOwned o;
    Plan *p = flat_plan(3, 1, 0, &s);  // fsdp: each rank its shard, at the storage
    rt_flat_owned(p, s, 3, &o);
    cr_assert(!o.replicated && o.flat_first == 0 && o.flat_stride == 11 && o.count == 11 && o.byte_stride == 0);
    plan_free(p);
    p = flat_plan(3, 0, 1, &s);  // zero1/zero2: each rank the shard it updates, inside the full buffer
    rt_flat_owned(p, s, 3, &o);
    cr_assert(!o.replicated && o.flat_first == 0 && o.flat_stride == 11 && o.count == 11 && o.byte_stride == 44);
    rt_flat_owned(p, s, 1, &o);
    cr_assert(o.replicated, "world 1: rank 0 has it all");
    plan_free(p);
    p = flat_plan(3, 0, 0, &s);  // ddp: every rank the same whole buffer
    rt_flat_owned(p, s, 3, &o);
    cr_assert(o.replicated && o.count == 33);
    plan_free(p);
}

/* ---- the executor with flat layouts (world 1) ------------------------------------------------ */

Test(exec_flat, storage_is_initialized_and_views_read_it)
{
    int32_t s;
    Plan *p = flat_plan(1, 0, 1, &s);
    char err[512];
    Exec *e = rt_exec_new(p, &(ExecOptions){.seed = 9}, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    float whole[FLAT_NUMEL];
    whole_flat(9, whole, FLAT_NUMEL);
    RtTensor t;
    cr_assert_eq(rt_exec_tensor(e, "flat_param", &t), 0);
    cr_assert_eq(memcmp(t.data, whole, sizeof whole), 0);
    cr_assert_eq(rt_exec_tensor(e, "h.0.u", &t), 0);
    cr_assert_eq(memcmp(t.data, whole + 26, 6 * sizeof(float)), 0, "a view reads its flat range");
    rt_exec_free(e);
    plan_free(p);
}

Test(exec_flat, world_mismatch_names_both)
{
    int32_t s;
    Plan *p = flat_plan(4, 1, 0, &s);
    char err[512];
    cr_assert_null(rt_exec_new(p, &(ExecOptions){.seed = 1, .world = 2, .rank = 1}, err, sizeof err));
    cr_assert(strstr(err, "plan compiled for world 4, but 2 ranks started"), "%s", err);
    cr_assert_null(rt_exec_new(p, &(ExecOptions){.seed = 1}, err, sizeof err));
    cr_assert(strstr(err, "plan compiled for world 4, but 1 rank started"), "%s", err);
    plan_free(p);
}

Test(exec_flat, views_must_lie_in_their_root_on_every_rank)
{
    int32_t s;
    Plan *p = flat_plan(1, 1, 0, &s);
    p->tensors[s + 2].alias = s;  // h.0.w claims the storage but lies in the gathered buffer
    char err[512];
    cr_assert_null(rt_exec_new(p, &(ExecOptions){.seed = 1}, err, sizeof err));
    cr_assert(strstr(err, "h.0.w") && strstr(err, "alias"), "%s", err);
    plan_free(p);
    p = flat_plan(1, 0, 0, &s);
    p->tensors[s + 1].offset += 2;  // not f32-aligned
    cr_assert_null(rt_exec_new(p, &(ExecOptions){.seed = 1}, err, sizeof err));
    cr_assert(strstr(err, "not 4-aligned"), "%s", err);
    plan_free(p);
}

/* x -> all_reduce(avg) -> y, x -> all_gather -> z, world 1: the local kernels move bytes. */
Test(exec_flat, collectives_of_a_world_of_one)
{
    Plan *p = plan_new();
    PlanTensor in = {.dtype = PLAN_DT_F32, .role = PLAN_ROLE_PARAM, .init = PLAN_INIT_UNIFORM, .init_a = -1,
                     .init_b = 1, .alias = PLAN_NONE};
    int32_t x = add_tensor(p, in, "x", 1, 6);
    PlanTensor out = {.dtype = PLAN_DT_F32, .role = PLAN_ROLE_ACT, .offset = 64, .alias = PLAN_NONE};
    int32_t y = add_tensor(p, out, "y", 1, 6);
    out.offset = 128;
    int32_t z = add_tensor(p, out, "z", 1, 6);
    const char *ops[2] = {"all_reduce", "all_gather"};
    int32_t outs[2] = {y, z};
    for (int k = 0; k < 2; k++) {
        PlanAttr w = {.key = plan_intern(p, "world"), .kind = PLAN_ATTR_INT, .i = 1};
        PlanOp op = {.op = plan_intern(p, ops[k]), .block = PLAN_NONE, .phase = PLAN_PHASE_COMM,
                     .in = plan_id_add(p, x), .n_in = 1, .attr = plan_attr_add(p, &w), .n_attr = 1};
        op.out = plan_id_add(p, outs[k]), op.n_out = 1;
        plan_op_add(p, &op);
        p->tensors[outs[k]].producer = k;
        p->tensors[outs[k]].live_start = k, p->tensors[outs[k]].live_end = 2;
    }
    p->tensors[x].live_end = 2;
    plan_output_add(p, y);
    plan_output_add(p, z);
    plan_set_one_program(p, 1, 192, 0);
    char err[512];
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
    Exec *e = rt_exec_new(p, &(ExecOptions){.seed = 3}, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    cr_assert_eq(rt_exec_run(e, 1, RT_PHASES_ALL), 0);
    RtTensor tx, ty, tz;
    rt_exec_tensor(e, "x", &tx), rt_exec_tensor(e, "y", &ty), rt_exec_tensor(e, "z", &tz);
    cr_assert_eq(memcmp(tx.data, ty.data, 24), 0);
    cr_assert_eq(memcmp(tx.data, tz.data, 24), 0);
    rt_exec_free(e);
    /* A collective for another world than the run's is refused. */
    p->attrs[0].i = 2;
    cr_assert_null(rt_exec_new(p, &(ExecOptions){.seed = 3}, err, sizeof err));
    cr_assert(strstr(err, "all_reduce") && strstr(err, "world of 2"), "%s", err);
    plan_free(p);
}

Test(exec_flat, weights_are_saved_by_param_and_load_back, .init = make_tmpdir, .fini = remove_tmpdir)
{
    int32_t s;
    Plan *p = flat_plan(1, 1, 0, &s);  // a sharded storage of a world of one: all of it
    char err[512], path[300];
    snprintf(path, sizeof path, "%s/w.safetensors", tmpdir);
    Exec *a = rt_exec_new(p, &(ExecOptions){.seed = 4}, err, sizeof err);
    Exec *b = rt_exec_new(p, &(ExecOptions){.seed = 5}, err, sizeof err);
    cr_assert(a && b, "%s", err);
    cr_assert_eq(rt_save_weights(a, path, 0, err, sizeof err), 0, "%s", err);
    /* The file holds the params under their names and shapes, not the storage. */
    float w[15], bias[7], z[4], u[6];
    StEntry t[N_SPECS] = {{"h.0.w", PLAN_DT_F32, 2, (int64_t[]){3, 5}, w}, {"h.0.b", PLAN_DT_F32, 1, (int64_t[]){7}, bias},
                          {"h.0.z", PLAN_DT_F32, 1, (int64_t[]){4}, z}, {"h.0.u", PLAN_DT_F32, 2, (int64_t[]){2, 3}, u}};
    cr_assert_eq(rt_st_read(path, t, N_SPECS, err, sizeof err), 0, "%s", err);
    float want[15];
    rt_init_param("h.0.w", 4, PLAN_INIT_NORMAL, 0.02, 0, 0, 15, want);
    cr_assert_eq(memcmp(w, want, sizeof w), 0);
    cr_assert(bias[0] == 1 && bias[6] == 1 && z[3] == 0);
    RtTensor sa, sb;
    rt_exec_tensor(a, "flat_param", &sa), rt_exec_tensor(b, "flat_param", &sb);
    cr_assert_neq(memcmp(sa.data, sb.data, 4 * (size_t)sa.numel), 0);
    cr_assert_eq(rt_load_weights(b, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(memcmp(sa.data, sb.data, 4 * (size_t)sa.numel), 0, "the storage takes the file's params");
    rt_exec_free(a);
    rt_exec_free(b);
    plan_free(p);
}

/* ---- a rank's rows of the global batch -------------------------------------------------------- */

Test(data, rank_rows_tile_the_global_batch)
{
    enum { N = 5000, T = 8, BG = 12 };
    uint16_t *tok = malloc(sizeof *tok * N);
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)(i * 7 % 251);
    RtTokens t = {tok, N, RT_TOKENS_RAW};
    int32_t whole_x[BG * T], whole_y[BG * T], x[BG * T], y[BG * T];
    for (int order = 0; order < 2; order++) {
        rt_lm_batch(&t, (RtDataOrder)order, 3, 7, BG, T, whole_x, whole_y);
        for (int world = 1; world <= 4; world++) {
            if (BG % world) continue;
            int64_t b = BG / world;
            for (int r = 0; r < world; r++)
                rt_lm_rows(&t, (RtDataOrder)order, 3, 7, BG, r * b, b, T, x + r * b * T, y + r * b * T);
            cr_assert_eq(memcmp(x, whole_x, sizeof x), 0, "order %d world %d", order, world);
            cr_assert_eq(memcmp(y, whole_y, sizeof y), 0);
        }
    }
    free(tok);
    enum { D = 3, K = 4 };
    float centers[K * D], fx[BG * D], gx[BG * D];
    int32_t fy[BG], gy[BG];
    rt_blob_centers(5, K, D, centers);
    rt_blobs_batch(centers, 5, 2, BG, D, K, fx, fy);
    for (int r = 0; r < 3; r++) rt_blobs_rows(centers, 5, 2, r * 4, 4, D, K, gx + r * 4 * D, gy + r * 4);
    cr_assert_eq(memcmp(fx, gx, sizeof fx), 0);
    cr_assert_eq(memcmp(fy, gy, sizeof fy), 0);
}

/* ---- point-to-point ops and a pipeline's weights files -------------------------------- */

Test(p2p, prepare_binds_a_message)
{
    RtColl c;
    char err[256];
    float buf[6];
    cr_assert_eq(rt_coll_kind("send"), RT_COLL_SEND);
    cr_assert_eq(rt_coll_kind("recv"), RT_COLL_RECV);
    cr_assert_eq(rt_p2p_prepare(&c, RT_COLL_SEND, PLAN_DT_F32, buf, 6, 3, 1, err, sizeof err), 0, "%s", err);
    cr_assert(c.peer == 3 && c.sync == 1 && c.n == 6 && c.in == buf && c.slot == -1 && c.op == PLAN_NONE);
    cr_assert(c.range[0].lo == (uintptr_t)buf && c.range[0].hi == (uintptr_t)(buf + 6));
    cr_assert_eq(rt_p2p_prepare(&c, RT_COLL_RECV, PLAN_DT_BF16, buf, 6, 0, 1, err, sizeof err), 0, "%s", err);
    cr_assert(c.sync == 0 && c.out == buf && c.range[0].hi == (uintptr_t)buf + 12, "a receive is never synchronous");
    cr_assert_eq(rt_p2p_prepare(&c, RT_COLL_SEND, PLAN_DT_F32, buf, (int64_t)INT32_MAX + 1, 1, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "exceeds MPI's int count"), "%s", err);
    cr_assert_eq(rt_p2p_prepare(&c, RT_COLL_ALL_REDUCE, PLAN_DT_F32, buf, 6, 1, 0, err, sizeof err), -1);
    cr_assert_eq(rt_coll_prepare(&c, RT_COLL_SEND, PLAN_DT_F32, buf, 6, buf, 6, 2, 0, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "point-to-point"), "%s", err);
}

Test(p2p, stage_weights_take_sharded_names)
{
    char buf[256];
    cr_assert_str_eq(rt_weights_shard_path("out.safetensors", 0, 2, buf, sizeof buf), "out-00001-of-00002.safetensors");
    cr_assert_str_eq(rt_weights_shard_path("d/w.safetensors", 2, 3, buf, sizeof buf), "d/w-00003-of-00003.safetensors");
    cr_assert_str_eq(rt_weights_shard_path("w.bin", 1, 2, buf, sizeof buf), "w.bin-00002-of-00002.safetensors");
    cr_assert_str_eq(rt_weights_shard_path("out.safetensors", 0, 1, buf, sizeof buf), "out.safetensors");
}

/* A file may hold other stages' params (rt_st_read_part), and nothing else. */
Test(p2p, a_stage_reads_its_params_from_the_whole_model, .init = make_tmpdir, .fini = remove_tmpdir)
{
    char path[300], err[512];
    snprintf(path, sizeof path, "%s/m.safetensors", tmpdir);
    float a[2] = {1, 2}, b[3] = {3, 4, 5}, got[2] = {0};
    StEntry both[2] = {{"a", PLAN_DT_F32, 1, (int64_t[]){2}, a}, {"b", PLAN_DT_F32, 1, (int64_t[]){3}, b}};
    cr_assert_eq(rt_st_write(path, both, 2, 0, err, sizeof err), 0, "%s", err);
    StEntry mine = {"a", PLAN_DT_F32, 1, (int64_t[]){2}, got};
    cr_assert_eq(rt_st_read(path, &mine, 1, err, sizeof err), -1);
    cr_assert(strstr(err, "tensor 'b' is not in the model"), "%s", err);
    const char *others[] = {"b"}, *wrong[] = {"c"};
    cr_assert_eq(rt_st_read_part(path, &mine, 1, wrong, 1, err, sizeof err), -1);
    cr_assert_eq(rt_st_read_part(path, &mine, 1, others, 1, err, sizeof err), 0, "%s", err);
    cr_assert(got[0] == 1 && got[1] == 2);
}
