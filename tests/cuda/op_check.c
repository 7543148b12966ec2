/* tests/cuda/op_check.c: every op of a plan on CUDA against the CPU backend, one op at a
 * time, from identical inputs. Needs a GPU; run by bench/gpu_check.sh on one.
 *
 *   op_check PLAN [--tf32] [--seed S] [--tol-f32 X] [--tol-16 X] [--verbose] [--decode POS]
 *
 * --decode POS checks the plan's decode program instead (passes/decode.c): its token is 1,
 * its position POS, and its KV caches start as the same uniform numbers in [-1, 1) on
 * both backends (as if POS earlier positions had filled them), so attention_decode
 * writes row POS and attends over rows 0..POS.
 *
 * The CPU Exec is made as fsexec makes it (the host mirror), step 1's batch is written
 * into it, and the CUDA backend is made from it, so both arenas start equal. Then for
 * each op k in plan order: k runs on the CPU (rt_exec_run_ops k..k+1) and on CUDA
 * (run_ops k..k+1); what k wrote on CUDA is downloaded and compared with the CPU's
 * bytes, and the CPU's bytes are uploaded, so op k+1 starts from identical inputs again
 * and an error is always the error of one op. What k wrote: its outputs, and for effect
 * ops (adamw, sgd, count_step, scale_update) the inputs they update. Ops a fused group
 * computes in its last member's one launch have no CUDA work of their own: their
 * outputs are compared (where that launch writes them) and refreshed with that launch.
 *
 * The error of a tensor is max|cuda - cpu| / (max|cpu| + 1e-30), NaN against NaN equal,
 * NaN against a number infinite; the tolerance is by dtype: f32 1e-5 (TOL_TF32 for a plan
 * compiled with the tf32 setting, whose GEMMs and attention round their inputs to 10 bits;
 * --tf32 only repeats the plan's setting, as fsexec's does), f16 and bf16 1e-2 (an output
 * rounded once either way is within one unit in the last place, 2^-8 for bf16), i32
 * exact. One line per op kind with its worst error; exit 0 when every op is within its
 * tolerance, 1 when one is not (or CUDA fails), 2 when the check cannot run (no GPU, a
 * plan without a CUDA program, a plan for several ranks). Then, from a backend that
 * measures its kernels (the CPU emulator of tests/cuda_emu), its table of them.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "ops.h"
#include "runtime.h"

/* f32 outputs of a tf32 plan: TF32 keeps 11 significant bits (unit roundoff 2^-11 = 4.9e-4) of each operand of
 * a product, and attention rounds several in a chain (q, k, v and P; dO and dS in the backward) whose errors the
 * softmax amplifies by the scores' size. A float64 model of exactly those roundings on random q, k, v with scores
 * of standard deviation 1 to 9 (tests/py/tf32_error.py) errs by 3e-4 to 4e-3 of the largest output; the cuda-emu
 * tests see up to 4e-3. */
#define TOL_TF32 5e-3

typedef struct {
    const char *name;
    int ops;
    double worst;
    int32_t worst_op, worst_tensor;
    int bad;
} Kind;

typedef struct {
    const Plan *p;
    Exec *e;
    const RtBackendOps *ops;
    RtBackend *dev;
    double tol_f32, tol_16;
    int verbose;
    void *scratch;          // a downloaded tensor
    Kind kinds[OP_COUNT];
    int32_t *pending;       // outputs of ops without CUDA work of their own, awaiting their group
    int32_t n_pending;
    int violations;
} Check;

static double f16_to_f64(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return h & 0x8000 ? -v : v;
}

static double elem(const void *data, PlanDType t, int64_t i)
{
    switch (t) {
    case PLAN_DT_F32: return ((const float *)data)[i];
    case PLAN_DT_F16: return f16_to_f64(((const uint16_t *)data)[i]);
    case PLAN_DT_BF16: {
        uint32_t u = (uint32_t)((const uint16_t *)data)[i] << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    case PLAN_DT_I32: return ((const int32_t *)data)[i];
    case PLAN_DT_COUNT: break;
    }
    return NAN;
}

/* max|a - b| / (max|b| + tiny), with NaN and infinities compared as values. */
static double rel_error(const void *a, const void *b, PlanDType t, int64_t n)
{
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = elem(a, t, i), y = elem(b, t, i);
        if (isnan(x) || isnan(y)) {
            if (isnan(x) != isnan(y)) return INFINITY;
            continue;
        }
        if (isinf(x) || isinf(y)) {
            if (x != y) return INFINITY;
            continue;
        }
        diff = fmax(diff, fabs(x - y));
        scale = fmax(scale, fabs(y));
    }
    return diff / (scale + 1e-30);
}

static int has_cuda_work(const Plan *p, int32_t k)
{
    if (rt_coll_kind(plan_str(p, p->ops[k].op)) >= 0) return 1;
    for (int32_t i = 0; i < p->n_cuda; i++)
        if (p->cuda[i].op == k) return 1;
    return 0;
}

static int is_arg_of(const Plan *p, int32_t k, int32_t tensor)
{
    for (int32_t i = 0; i < p->n_cuda; i++)
        for (int32_t a = 0; p->cuda[i].op == k && a < p->cuda[i].n_args; a++)
            if (p->ids[p->cuda[i].args + a] == tensor) return 1;
    return 0;
}

static void where(const Plan *p, int32_t k, char *buf, size_t n)
{
    const PlanOp *o = &p->ops[k];
    const char *src = plan_meta_str(p, "source", "");
    snprintf(buf, n, "op %d at %s%s%d:%d", k, src, *src ? ":" : "", o->line, o->col);
}

/* Tensor id as CUDA wrote it against the CPU's; then the CPU's bytes go up. */
static int compare(Check *c, int32_t k, int32_t id)
{
    const PlanTensor *t = &c->p->tensors[id];
    void *cpu = rt_exec_data(c->e, id);
    if (c->ops->download(c->dev, id, c->scratch)) return -1;
    double err = rel_error(c->scratch, cpu, t->dtype, plan_tensor_numel(t));
    double tol = t->dtype == PLAN_DT_F32 ? c->tol_f32 : t->dtype == PLAN_DT_I32 ? 0 : c->tol_16;
    Kind *kd = &c->kinds[op_lookup(plan_str(c->p, c->p->ops[k].op))];
    if (!(err <= tol)) {
        char at[256];
        where(c->p, k, at, sizeof at);
        const char *name = plan_str(c->p, t->name);
        fprintf(stderr, "op_check: %s (%s): tensor %d %s %s: error %.3g > %.0e\n", at, kd->name, id,
                *name ? name : "(unnamed)", plan_dtype_name(t->dtype), err, tol);
        kd->bad++;
        c->violations++;
    }
    if (!(err <= kd->worst)) kd->worst = err, kd->worst_op = k, kd->worst_tensor = id;
    return c->ops->upload(c->dev, id, cpu);
}

/* Op k on both backends, then everything it (and the group it ends) wrote compared. */
static int check_op(Check *c, int32_t k)
{
    const Plan *p = c->p;
    const PlanOp *o = &p->ops[k];
    OpKind kind = op_lookup(plan_str(p, o->op));
    if (rt_exec_run_ops(c->e, 1, k, k + 1, RT_PHASES_ALL)) {
        fprintf(stderr, "op_check: op %d on the CPU: %s\n", k, rt_exec_error(c->e));
        return -1;
    }
    if (c->ops->run_ops(c->dev, k, k + 1)) return -1;
    if (!has_cuda_work(p, k)) {
        int view = o->n_in >= 1 && o->n_out == 1 && (op_info(kind)->flags & OPF_VIEW) &&
                   rt_exec_data(c->e, p->ids[o->out]) == rt_exec_data(c->e, p->ids[o->in]);
        for (int32_t i = 0; i < o->n_out && !view; i++) c->pending[c->n_pending++] = p->ids[o->out + i];
        return 0;
    }
    Kind *kd = &c->kinds[kind];
    kd->name = plan_str(p, o->op);
    kd->ops++;
    for (int32_t i = 0; i < o->n_out; i++)
        if (compare(c, k, p->ids[o->out + i])) return -1;
    for (int32_t i = 0; i < o->n_in && (op_info(kind)->flags & OPF_EFFECT); i++)
        if (compare(c, k, p->ids[o->in + i])) return -1;
    /* The group's members: compared where its launch wrote them; refreshed either way. */
    for (int32_t j = 0; j < c->n_pending; j++) {
        int32_t id = c->pending[j];
        if (is_arg_of(p, k, id) ? compare(c, k, id) : c->ops->upload(c->dev, id, rt_exec_data(c->e, id))) return -1;
    }
    c->n_pending = 0;
    return 0;
}

static void report(const Check *c)
{
    int fused = 0;
    for (int32_t k = 0; k < c->p->n_ops; k++) fused += !has_cuda_work(c->p, k);
    printf("%-20s %5s  %-10s %-9s %s\n", "op", "count", "worst", "", "where");
    for (int k = 0; k < OP_COUNT; k++) {
        const Kind *kd = &c->kinds[k];
        if (!kd->ops) continue;
        char at[256];
        where(c->p, kd->worst_op, at, sizeof at);
        printf("%-20s %5d  %-10.3g %-9s %s, tensor %d\n", kd->name, kd->ops, kd->worst, kd->bad ? "VIOLATED" : "ok", at,
               kd->worst_tensor);
    }
    printf("op_check: %d ops (%d without CUDA work of their own: views, fused into a later launch); %s\n",
           c->p->n_ops, fused, c->violations ? "VIOLATIONS" : "every op within tolerance");
}

static int usage(void)
{
    fprintf(stderr, "usage: op_check PLAN [--tf32] [--seed S] [--tol-f32 X] [--tol-16 X] [--verbose] [--decode POS]\n");
    return 2;
}

/* The decode program's inputs (--decode): token 1 at position at, caches of uniform numbers. */
static int decode_inputs(const Plan *p, Exec *e, int64_t at)
{
    uint64_t r = 0x9E3779B97F4A7C15ull;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        void *d = rt_exec_data(e, i);
        if (t->role == PLAN_ROLE_INPUT && t->step_role == PLAN_SR_POS) {
            *(int32_t *)d = (int32_t)at;
        } else if (t->role == PLAN_ROLE_INPUT && t->step_role == PLAN_SR_NONE && t->dtype == PLAN_DT_I32) {
            for (int64_t k = 0; k < plan_tensor_numel(t); k++) ((int32_t *)d)[k] = 1;
        } else if (t->role == PLAN_ROLE_KV_CACHE && t->alias == PLAN_NONE) {
            if (t->dtype != PLAN_DT_F32) return -1;
            for (int64_t k = 0; k < plan_tensor_numel(t); k++) {
                r ^= r >> 12, r ^= r << 25, r ^= r >> 27;
                ((float *)d)[k] = (float)((double)((r * 2685821657736338717ull) >> 11) / 4503599627370496.0 - 1.0);
            }
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    int tf32 = 0, verbose = 0;
    uint64_t seed = 0;
    double tol_f32 = -1, tol_16 = 1e-2;
    long long decode_at = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tf32")) tf32 = 1;
        else if (!strcmp(argv[i], "--verbose")) verbose = 1;
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--tol-f32") && i + 1 < argc) tol_f32 = atof(argv[++i]);
        else if (!strcmp(argv[i], "--tol-16") && i + 1 < argc) tol_16 = atof(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc) decode_at = atoll(argv[++i]);
        else if (argv[i][0] == '-' || path) return usage();
        else path = argv[i];
    }
    if (!path) return usage();
    char err[2048];
    Plan *p = plan_read(path, err, sizeof err);
    if (!p) {
        fprintf(stderr, "op_check: %s: %s\n", path, err);
        return 2;
    }
    if (decode_at >= 0) {  // the decode program alone
        Plan *whole = p;
        p = whole->decode, whole->decode = NULL;
        plan_free(whole);
        if (!p) {
            fprintf(stderr, "op_check: --decode: %s has no decode program\n", path);
            return 2;
        }
    }
    const RtBackendOps *ops = rt_backend_load_cuda(err, sizeof err);
    if (!ops || ops->probe(err, sizeof err) || rt_backend_plan_has_cuda(p, err, sizeof err)) {
        fprintf(stderr, "op_check: %s%s\n", ops && !strstr(err, "CUDA program") ? "no CUDA GPU: " : "", err);
        plan_free(p);
        return 2;
    }
    if (tf32 && !plan_meta_int(p, "tf32", 0)) {
        fprintf(stderr, "op_check: --tf32: %s was compiled with tf32 0; compile it with --tf32 1\n", path);
        plan_free(p);
        return 2;
    }
    tf32 = plan_meta_int(p, "tf32", 0) != 0;
    if (plan_meta_int(p, "world", 1) != 1) {
        fprintf(stderr, "op_check: %s: a plan for world %" PRId64 "; op_check runs world-1 plans\n", path,
                plan_meta_int(p, "world", 1));
        plan_free(p);
        return 2;
    }
    Check c = {.p = p, .ops = ops, .tol_f32 = tol_f32 >= 0 ? tol_f32 : tf32 ? TOL_TF32 : 1e-5, .tol_16 = tol_16,
               .verbose = verbose};
    ExecOptions eo = {.seed = seed ? seed : (uint64_t)plan_meta_int(p, "seed", 0), .rank = 0, .world = 1};
    RtData *data = NULL;
    int rc = 2;
    int64_t biggest = 1;
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (plan_tensor_nbytes(&p->tensors[i]) > biggest) biggest = plan_tensor_nbytes(&p->tensors[i]);
    c.scratch = malloc((size_t)biggest);
    c.pending = malloc(sizeof *c.pending * ((size_t)p->n_tensors + 1));
    if (!c.scratch || !c.pending) {
        fprintf(stderr, "op_check: out of memory\n");
    } else if (!(c.e = rt_exec_new(p, &eo, err, sizeof err)) ||
               (decode_at < 0 && !(data = rt_data_open(c.e, NULL, RT_ORDER_RANDOM, eo.seed, err, sizeof err)))) {
        fprintf(stderr, "op_check: %s: %s\n", path, err);
    } else if (decode_at >= 0 && decode_inputs(p, c.e, decode_at)) {
        fprintf(stderr, "op_check: --decode: the KV caches are not f32\n");
    } else {
        if (data) rt_data_fill(data, 1);
        rt_exec_set_step(c.e, 1);  // both arenas start at step 1 (and dropout's RNG words with it)
        RtBackendOptions bo = {.plan = p, .host_arena = rt_exec_arena(c.e), .host_bytes = rt_exec_arena_bytes(c.e),
                               .rank = 0, .world = 1, .local_rank = -1, .tf32 = tf32, .verbose = verbose};
        if (!(c.dev = ops->create(&bo, err, sizeof err))) {
            fprintf(stderr, "%s\n", err);
        } else {
            RtBackendInfo info;
            ops->info(c.dev, &info);
            printf("op_check: %s on %s (%s), f32 tolerance %.0e, 16-bit %.0e\n", path, info.device, info.jit,
                   c.tol_f32, c.tol_16);
            rc = 0;
            for (int32_t k = 0; k < p->n_ops && !rc; k++) {
                if (check_op(&c, k)) {
                    fprintf(stderr, "%s\n", ops->error(c.dev));
                    rc = 1;
                }
                if (verbose && !rc) fprintf(stderr, "op_check: op %d (%s) done\n", k, plan_str(p, p->ops[k].op));
            }
            report(&c);
            const char *measured = ops->measures ? ops->measures(c.dev) : NULL;
            if (measured) fputs(measured, stdout);
            if (c.violations) rc = 1;
            ops->destroy(c.dev);
        }
    }
    rt_data_close(data);
    rt_exec_free(c.e);
    free(c.scratch);
    free(c.pending);
    plan_free(p);
    return rc;
}
