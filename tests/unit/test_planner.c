/* tests/unit/test_planner.c: the search of fsc --fit (planner/) against brute force over
 * the same space and cost model, the budget sweep, the machine file's errors, and the
 * winner's arena against the memory report of the same settings and the runtime's. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "planner.h"
#include "report.h"
#include "sample.h"

static char *source(const char *file, size_t *len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/samples/%s", FS_SOURCE_DIR, file);
    FILE *fp = fopen(path, "rb");
    cr_assert_not_null(fp, "%s", path);
    char *buf = malloc(1 << 20);
    *len = fread(buf, 1, (1 << 20) - 1, fp);
    buf[*len] = 0;
    fclose(fp);
    return buf;
}

static const Define DEFS[] = {{"L", 2}, {"C", 32}, {"NH", 2}, {"T", 16}, {"V", 64}, {"B", 4}};
static const Setting WORLD[] = {{"world", "2"}};

static const Define DEFS4[] = {{"L", 2}, {"C", 32}, {"NH", 2}, {"T", 16}, {"V", 64}, {"B", 8}};
static const Setting HYBRID[] = {{"world", "4"}, {"precision", "bf16"}, {"offload", "none"}, {"stages", "1"}};

/* slow: a machine 10^4 times slower at compute (FLOP/s and HBM), so that a small model's
 * ops, not the collectives' latency, decide its time, as a large model's do. */
static void fit_in(FitResult *r, const char *src, size_t len, int64_t budget, int brute, const Setting *s, int n,
                   int world, const Define *defs, int slow)
{
    FrontendOptions fo = {defs, 6, s, n};
    FitRequest q = {.src = src, .len = len, .path = "gpt2.fsm", .fo = &fo, .budget = budget, .world = world,
                    .brute = brute};
    machine_default(&q.machine);
    if (slow) q.machine.flops_fp32 /= 1e4, q.machine.flops_16bit /= 1e4, q.machine.hbm_bw /= 1e4;
    char err[2048];
    cr_assert_eq(planner_fit(&q, r, err, sizeof err), 0, "%s", err);
}

static void fit(FitResult *r, const char *src, size_t len, int64_t budget, int brute, const Setting *s, int n)
{
    fit_in(r, src, len, budget, brute, s, n, 2, DEFS, 0);
}

/* The same winner as compiling every valid candidate, over budgets from below the
 * smallest arena to above the largest; the modelled time never rises with the budget;
 * every bound below its candidate's modelled time; the memory and time orders the
 * pruning assumes hold of every pair brute force compiled. */
static void check_brute_force(int world, const Define *defs, const Setting *pinned, int n_pinned, int slow)
{
    size_t len;
    char *src = source("gpt2.fsm", &len);
    FitResult all;
    fit_in(&all, src, len, INT64_MAX / 2, 1, pinned, n_pinned, world, defs, slow);
    cr_assert_gt(all.n_points, 100, "a space of %lld points", (long long)all.n_points);
    cr_assert_lt(all.n_points, 10000);
    int64_t lo = INT64_MAX, hi = 0;
    for (int64_t i = 0; i < all.n_points; i++) {
        const FitPoint *p = &all.points[i];
        if (p->compiled != 1) continue;
        if (p->arena < lo) lo = p->arena;
        if (p->arena > hi) hi = p->arena;
        cr_assert_leq(p->lb, p->cost.time * (1 + 1e-9), "point %lld: bound %g over its time %g", (long long)i, p->lb,
                      p->cost.time);
    }
    cr_assert_lt(lo, hi);
    /* The time only rises along the space_time_up axes (recompute, selective,
     * reshard_after_forward), between any two compiled points one step apart there. */
    for (int64_t i = 0; i < all.n_points; i++)
        for (int64_t j = 0; j < all.n_points; j++) {
            const FitPoint *a = &all.points[i], *b = &all.points[j];
            int axis = -1, apart = 0;
            for (int x = 0; x < AX_COUNT; x++)
                if (a->cand.v[x] != b->cand.v[x]) apart++, axis = x;
            if (a->compiled == 1 && b->compiled == 1 && apart == 1 && a->cand.v[axis] < b->cand.v[axis] &&
                space_time_up(axis))
                cr_expect_leq(a->cost.time, b->cost.time, "%s %s -> %s: the time falls, %g -> %g", all.space.axes[axis].key,
                              all.space.axes[axis].value[a->cand.v[axis]], all.space.axes[axis].value[b->cand.v[axis]],
                              a->cost.time, b->cost.time);
        }
    double last = 1e30;
    for (int k = -1; k <= 12; k++) {
        int64_t budget = k < 0 ? lo - 1 : lo + (hi - lo) * k / 10;
        int64_t want = -1;  // brute force: the fastest that fit, then the smallest, then the first in bound order
        for (int64_t i = 0; i < all.n_points; i++) {
            const FitPoint *p = &all.points[i];
            if (p->compiled != 1 || p->arena > budget) continue;
            const FitPoint *w = want >= 0 ? &all.points[want] : NULL;
            if (!w || p->cost.time < w->cost.time ||
                (p->cost.time == w->cost.time && (p->arena < w->arena || (p->arena == w->arena &&
                                                  (p->lb < w->lb || (p->lb == w->lb && i < want))))))
                want = i;
        }
        FitResult r;
        fit_in(&r, src, len, budget, 0, pinned, n_pinned, world, defs, slow);
        cr_assert_eq(r.n_points, all.n_points);
        cr_assert_eq(r.winner, want, "budget %lld: search %lld, brute force %lld", (long long)budget,
                     (long long)r.winner, (long long)want);
        if (k < 0) cr_assert_eq(r.winner, -1, "nothing fits below the smallest arena");
        int on_front = r.winner < 0;  // the winner is a point of the front the report prints
        for (int i = 0; i < r.n_front; i++) on_front |= r.front[i] == r.winner;
        cr_assert(on_front, "budget %lld: the winner %lld (%g ms, %lld bytes) is not on the Pareto front",
                  (long long)budget, (long long)r.winner, r.points[r.winner].cost.time,
                  (long long)r.points[r.winner].arena);
        if (want >= 0) {
            cr_assert_leq(all.points[want].cost.time, last, "a larger budget, a slower plan");
            last = all.points[want].cost.time;
            cr_assert_lt(r.n_compiled, all.n_compiled, "the pruning compiled everything");
        }
        planner_free(&r);
    }
    planner_free(&all);
    free(src);
}

Test(planner, search_equals_brute_force_over_budgets) { check_brute_force(2, DEFS, WORLD, 1, 0); }

/* World 4 with hybrid sharding's groups of 2, instance and selective recompute in the
 * space (bf16, one stage, no offload pinned to keep it small). */
Test(planner, search_equals_brute_force_hybrid_and_selective)
{
    check_brute_force(4, DEFS4, HYBRID, 4, 0);
}

/* Pipelines at world 4 on a slow machine: five blocks (uneven cuts, up to a pure
 * pipeline of 4 stages) and a head as costly as several of them, so the bound's busiest
 * stage (the best cut, the head on the last stage) is what bounds some; bf16 and no
 * offload pinned to keep it small. */
static const Define DEFS_PIPE[] = {{"L", 5}, {"C", 32}, {"NH", 2}, {"T", 16}, {"V", 1024}, {"B", 8}};
static const Setting PIPE[] = {{"world", "4"}, {"precision", "bf16"}, {"offload", "none"}};

Test(planner, search_equals_brute_force_pipelines) { check_brute_force(4, DEFS_PIPE, PIPE, 3, 1); }

/* The winner's arena is the memory report's for its settings (fsc --mem), and the CPU
 * runtime allocates exactly it and runs a step within it (the guard on). */
Test(planner, winner_arena_is_the_memory_report_and_the_runtime)
{
    size_t len;
    char *src = source("gpt2.fsm", &len);
    const Setting one[] = {{"world", "1"}};
    FitResult r;
    FrontendOptions fo = {DEFS, 6, one, 1};
    FitRequest q = {.src = src, .len = len, .path = "gpt2.fsm", .fo = &fo, .budget = 64 << 20, .world = 1};
    machine_default(&q.machine);
    char err[2048];
    cr_assert_eq(planner_fit(&q, &r, err, sizeof err), 0, "%s", err);
    cr_assert_geq(r.winner, 0);
    Setting sets[AX_COUNT + 2];
    sets[0] = one[0];
    int n = 1 + space_settings(&r.space, &r.points[r.winner].cand, sets + 1);
    Plan *p = sample_compile("gpt2.fsm", DEFS, 6, sets, n, NULL);
    MemStages *st = report_stages_new(p, err, sizeof err);
    cr_assert_not_null(st, "%s", err);
    cr_assert_eq(report_stages_largest(st)->arena_bytes, r.points[r.winner].arena);
    Exec *e = rt_exec_new(p, &(ExecOptions){.seed = 5, .guard = 1}, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    cr_assert_eq(rt_exec_arena_bytes(e), r.points[r.winner].arena);
    cr_assert_eq(rt_exec_run(e, 1, RT_PHASES_ALL), 0, "%s", rt_exec_error(e));
    rt_exec_free(e);
    report_stages_free(st);
    plan_free(p);
    planner_free(&r);
    free(src);
}

/* A pinned setting is searched no further: its one value in every candidate. */
Test(planner, pinned_settings_stay)
{
    size_t len;
    char *src = source("gpt2.fsm", &len);
    const Setting s[] = {{"world", "2"}, {"shard", "fsdp"}};
    FitResult r;
    fit(&r, src, len, INT64_MAX / 2, 0, s, 2);
    cr_assert_eq(r.space.axes[AX_SHARD].n, 1);
    cr_assert(r.space.axes[AX_SHARD].pinned);
    cr_assert_geq(r.winner, 0);
    cr_assert_str_eq(space_value(&r.space, &r.points[r.winner].cand, AX_SHARD), "fsdp");
    Setting out[AX_COUNT + 1];
    int n = space_settings(&r.space, &r.points[r.winner].cand, out);
    for (int i = 0; i < n; i++) cr_assert_str_neq(out[i].key, "shard", "a pinned setting is not repeated");
    planner_free(&r);
    free(src);
}

static void machine_error(const char *json, const char *want)
{
    char path[] = "/tmp/fs_machine_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *fp = fdopen(fd, "w");
    fputs(json, fp);
    fclose(fp);
    Machine m;
    char err[1024] = "";
    cr_assert_eq(machine_load(&m, path, err, sizeof err), -1, "%s loaded", json);
    cr_assert(strstr(err, path) && strstr(err, want), "'%s': want '%s' in '%s'", json, want, err);
    remove(path);
}

#define ALL_KEYS "\"gpus_per_node\": 4, \"flops_fp32\": 1e13, \"flops_16bit\": 1e14, \"hbm_bw\": 1e12, " \
    "\"nvlink_bw\": 1e11, \"ib_bw\": 1e10, \"pcie_bw\": 1e10, \"host_flops\": 1e11, \"host_bw\": 1e10, " \
    "\"collective_latency\": 1e-5"

Test(planner, machine_file)
{
    machine_error("{", "line 1");
    machine_error("[1]", "expected a JSON object");
    machine_error("{" ALL_KEYS ", \"hbm\": 3}", "hbm: unknown key");
    machine_error("{\"gpus_per_node\": 4}", "flops_fp32: missing");
    machine_error("{" ALL_KEYS ", \"ib_bw\": \"fast\"}", "ib_bw: expected a number");
    machine_error("{" ALL_KEYS ", \"gpus_per_node\": 0}", "gpus_per_node: expected an integer");
    char path[] = "/tmp/fs_machine_XXXXXX";
    int fd = mkstemp(path);
    FILE *fp = fdopen(fd, "w");
    fputs("{\"name\": \"small\", " ALL_KEYS "}", fp);
    fclose(fp);
    Machine m;
    char err[1024];
    cr_assert_eq(machine_load(&m, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m.gpus_per_node, 4);
    cr_assert_eq(m.ib_bw, 1e10);
    cr_assert_str_eq(m.name, "small");
    remove(path);
}
