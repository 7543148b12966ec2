/* tools/fsexec.c: the runtime's command line. Thin: parse flags, load the plan (every
 * check is plan_read's), set up the executor, the data and the reporting, run the steps,
 * save what was asked. Exit status: 0 done, 1 an error (a bad plan, an unreadable file,
 * a loss that is not finite), 2 a usage error or something this build cannot do.
 *
 * The step loop allocates nothing: data fill, kernels, reading the scalar outputs and
 * one progress line. The one exception is --save-grads, which writes a file in step 1,
 * between backward and the optimizer (where every gradient is complete and live).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime.h"

static const char USAGE[] =
    "usage: fsexec [options] PLAN\n"
    "       fsexec --inspect PLAN\n"
    "\n"
    "Runs a training plan compiled by fsc, or shows what one holds.\n"
    "\n"
    "options:\n"
    "  --steps N            training steps (default 100); 0 only initializes (with\n"
    "                       --save-weights: export the initial weights)\n"
    "  --seed S             seed of parameter init and data (default: the plan's seed)\n"
    "  --threads N          OpenMP and OpenBLAS threads (default: all cores)\n"
    "  --data FILE          token file: llm.c's format or raw uint16 (default: a built-in\n"
    "                       byte-level corpus for language models; Gaussian blobs for\n"
    "                       classifiers, which take no file)\n"
    "  --data-order ORDER   random (default) or sequential windows\n"
    "  --log FILE           one JSON line per step: step, loss, lr, grad_norm,\n"
    "                       tokens_per_s, ms (and accuracy for classifiers)\n"
    "  --log-every N        plain progress lines every N steps when stderr is not a\n"
    "                       terminal (default: 1 up to 100 steps, else 10)\n"
    "  --save-weights FILE  write the params as safetensors after the last step\n"
    "  --load-weights FILE  start from the params in a safetensors file\n"
    "  --save-grads FILE    write step 1's gradients (under the params' names)\n"
    "  --debug-nan          fill every buffer with NaN outside its planned live range\n"
    "  --inspect PLAN       print what PLAN holds (format, model, training settings, ranks,\n"
    "                       params, inputs, blocks, ops, tensors by role, sections) and exit\n"
    "  -h, --help           print this help and exit\n"
    "  -V, --version        print the version and exit\n";

typedef struct {
    const char *plan, *inspect, *data, *log, *save_weights, *load_weights, *save_grads;
    int64_t steps;
    uint64_t seed;
    int has_seed, threads, log_every, debug_nan;
    RtDataOrder order;
} Flags;

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "fsexec: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see fsexec --help)\n");
    return 2;
}

static Plan *load(const char *path)
{
    char err[512];
    Plan *p = plan_read(path, err, sizeof err);
    if (!p) fprintf(stderr, "fsexec: %s: %s\n", path, err);
    return p;
}

static int inspect(const char *path)
{
    Plan *p = load(path);
    if (!p) return 1;
    printf("file          %s\n", path);
    rt_inspect(p, stdout);
    plan_free(p);
    if (fflush(stdout) || ferror(stdout)) {
        fprintf(stderr, "fsexec: error writing the output\n");
        return 1;
    }
    return 0;
}

/* A whole decimal integer in [lo, hi]. */
static int parse_int(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "fsexec: %s: expected an integer from %" PRId64 " to %" PRId64 ", got '%s' "
                "(see fsexec --help)\n", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* The flags that take a value, as `--name VALUE` or `--name=VALUE`. */
typedef enum {
    V_INSPECT, V_STEPS, V_SEED, V_THREADS, V_DATA, V_DATA_ORDER, V_LOG, V_LOG_EVERY, V_SAVE_WEIGHTS,
    V_LOAD_WEIGHTS, V_SAVE_GRADS, V_COUNT
} ValueFlag;

static const char *const VALUE_FLAGS[V_COUNT] = {
    "--inspect", "--steps", "--seed", "--threads", "--data", "--data-order", "--log", "--log-every",
    "--save-weights", "--load-weights", "--save-grads",
};

/* 0, or the exit status of a usage error (after its message). */
static int set_value(Flags *f, ValueFlag which, const char *v)
{
    const char *flag = VALUE_FLAGS[which];
    int64_t n;
    switch (which) {
    case V_INSPECT: f->inspect = v; return 0;
    case V_STEPS: return parse_int(flag, v, 0, INT32_MAX, &f->steps) ? 2 : 0;
    case V_SEED: {
        char *end;
        errno = 0;
        f->seed = strtoull(v, &end, 0);
        if (end == v || *end || errno || v[0] == '-')
            return usage_error("--seed: expected a non-negative integer, got '%s'", v);
        f->has_seed = 1;
        return 0;
    }
    case V_THREADS:
        if (parse_int(flag, v, 1, 4096, &n)) return 2;
        f->threads = (int)n;
        return 0;
    case V_DATA: f->data = v; return 0;
    case V_DATA_ORDER:
        if (!strcmp(v, "random") || !strcmp(v, "sequential")) {
            f->order = v[0] == 'r' ? RT_ORDER_RANDOM : RT_ORDER_SEQUENTIAL;
            return 0;
        }
        return usage_error("--data-order: expected 'random' or 'sequential', got '%s'", v);
    case V_LOG: f->log = v; return 0;
    case V_LOG_EVERY:
        if (parse_int(flag, v, 1, INT32_MAX, &n)) return 2;
        f->log_every = (int)n;
        return 0;
    case V_SAVE_WEIGHTS: f->save_weights = v; return 0;
    case V_LOAD_WEIGHTS: f->load_weights = v; return 0;
    case V_SAVE_GRADS: f->save_grads = v; return 0;
    case V_COUNT: break;
    }
    return 2;
}

static int parse_args(int argc, char **argv, Flags *f)
{
    f->steps = 100;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(USAGE, stdout);
            exit(0);
        } else if (!strcmp(a, "-V") || !strcmp(a, "--version")) {
            printf("fsexec %s (plan format %d.%d)\n", RT_VERSION, PLAN_MAJOR, PLAN_MINOR);
            exit(0);
        } else if (!strcmp(a, "--debug-nan")) {
            f->debug_nan = 1;
            continue;
        } else if (!strcmp(a, "--")) {
            if (i + 1 < argc && f->plan) return usage_error("more than one plan given ('%s')", argv[i + 1]);
            if (i + 1 < argc) f->plan = argv[++i];
            continue;
        } else if (a[0] != '-' || !a[1]) {
            if (f->plan) return usage_error("more than one plan given ('%s')", a);
            f->plan = a;
            continue;
        }
        int which = 0;
        size_t n = 0;
        for (; which < V_COUNT; which++) {
            n = strlen(VALUE_FLAGS[which]);
            if (!strncmp(a, VALUE_FLAGS[which], n) && (a[n] == '=' || !a[n])) break;
        }
        if (which == V_COUNT) return usage_error("unknown option '%s'", a);
        if (!a[n] && i + 1 >= argc)
            return usage_error(which == V_INSPECT ? "%s needs a plan file" : "%s needs a value", a);
        int rc = set_value(f, (ValueFlag)which, a[n] ? a + n + 1 : argv[++i]);
        if (rc) return rc;
    }
    if (f->inspect && f->plan) return usage_error("--inspect takes one plan; '%s' is extra", f->plan);
    if (!f->inspect && !f->plan) return usage_error("%s", "no plan given");
    if (f->save_grads && f->steps == 0) return usage_error("%s", "--save-grads needs at least one step");
    return 0;
}

/* The scalar f32 output named `name`, or NULL. */
static const float *scalar_output(const Exec *e, const char *name)
{
    RtTensor t;
    if (rt_exec_tensor(e, name, &t) || t.dtype != PLAN_DT_F32 || t.numel != 1) return NULL;
    return t.data;
}

/* For classifiers: logits [B, K] f32 among the outputs and labels i32 [B]. */
static int accuracy_inputs(const Exec *e, const float **logits, const int32_t **y, int64_t *B, int64_t *K)
{
    const Plan *p = rt_exec_plan(e);
    int32_t xi, yi, li = rt_plan_logits(p);
    if (li == PLAN_NONE || rt_data_inputs(p, &xi, &yi)) return -1;
    RtTensor lt, yt;
    rt_exec_tensor_id(e, li, &lt);
    rt_exec_tensor_id(e, yi, &yt);
    if (lt.dtype != PLAN_DT_F32 || lt.rank != 2 || yt.dtype != PLAN_DT_I32 || yt.rank != 1 || yt.shape[0] != lt.shape[0])
        return -1;
    *logits = lt.data, *y = yt.data, *B = lt.shape[0], *K = lt.shape[1];
    return 0;
}

typedef struct {
    Exec *e;
    RtData *data;
    Progress *progress;
} Run;

/* Ends the progress display (its summary line) once; 0, or 1 after a message. */
static int end_progress(Run *r)
{
    char err[256];
    int rc = rt_progress_end(r->progress, err, sizeof err);
    r->progress = NULL;
    if (rc) fprintf(stderr, "fsexec: %s\n", err);
    return rc ? 1 : 0;
}

static void run_free(Run *r)
{
    end_progress(r);
    rt_data_close(r->data);
    rt_exec_free(r->e);
}

/* 1234567 -> "1,234,567" */
static const char *grouped(int64_t v, char *buf, size_t n)
{
    char digits[32];
    int len = snprintf(digits, sizeof digits, "%" PRId64, v);
    size_t at = 0;
    for (int i = 0; i < len && at + 2 < n; i++) {
        if (i && digits[i - 1] != '-' && (len - i) % 3 == 0) buf[at++] = ',';
        buf[at++] = digits[i];
    }
    buf[at] = 0;
    return buf;
}

static void start_line(const Plan *p, const Run *r, const Flags *f, uint64_t seed)
{
    int64_t params = plan_meta_int(p, "params", -1);
    if (params < 0) {
        params = 0;
        for (int32_t i = 0; i < p->n_tensors; i++)
            if (p->tensors[i].role == PLAN_ROLE_PARAM && p->tensors[i].tied_to == PLAN_NONE)
                params += plan_tensor_numel(&p->tensors[i]);
    }
    char num[32], mem[32];
    double mib = (double)rt_exec_arena_bytes(r->e) / (1 << 20);
    if (mib >= 1024)
        snprintf(mem, sizeof mem, "%.2f GiB", mib / 1024);
    else
        snprintf(mem, sizeof mem, mib >= 10 ? "%.0f MiB" : "%.2f MiB", mib);
    fprintf(stderr, "fsexec: %s | %s params | arena %s | %d thread%s | data: %s | %" PRId64 " step%s, seed %" PRIu64
            "%s\n", plan_meta_str(p, "model", "model"), grouped(params, num, sizeof num), mem, rt_threads(),
            rt_threads() == 1 ? "" : "s", rt_data_describe(r->data), f->steps, f->steps == 1 ? "" : "s", seed,
            f->debug_nan ? " | debug-nan" : "");
}

/* The step loop; 0, or 1 after a message. */
static int train(Run *r, const Flags *f, const char *path)
{
    char err[512];
    const Plan *p = rt_exec_plan(r->e);
    const float *loss = NULL, *lr = scalar_output(r->e, "lr"), *norm = scalar_output(r->e, "grad_norm"),
                *logits = NULL;
    RtTensor lt;
    if (p->n_outputs) {
        rt_exec_tensor_id(r->e, p->outputs[0], &lt);
        if (lt.dtype == PLAN_DT_F32 && lt.numel == 1) loss = lt.data;
    }
    if (!loss) {
        fprintf(stderr, "fsexec: %s: the plan's first output is not an f32 scalar loss\n", path);
        return 1;
    }
    const int32_t *labels = NULL;
    int64_t B = 0, K = 0;
    if (rt_data_get_kind(r->data) == RT_DATA_CLASSES) accuracy_inputs(r->e, &logits, &labels, &B, &K);
    int32_t split = rt_exec_first_op(r->e, PLAN_PHASE_OPTIMIZER), n_ops = p->n_ops;
    double items = (double)rt_data_items(r->data);

    for (int64_t step = 1; step <= f->steps; step++) {
        double t0 = rt_now();
        rt_data_fill(r->data, step);
        if (step == 1 && f->save_grads) {
            rt_exec_run_ops(r->e, step, 0, split, RT_PHASES_ALL);
            if (rt_save_grads(r->e, f->save_grads, step, err, sizeof err)) {
                fprintf(stderr, "fsexec: %s\n", err);
                return 1;
            }
            rt_exec_run_ops(r->e, step, split, n_ops, RT_PHASES_ALL);
        } else {
            rt_exec_run(r->e, step, RT_PHASES_ALL);
        }
        StepStats s = {.step = step, .loss = *loss, .lr = lr ? *lr : NAN, .grad_norm = norm ? *norm : NAN,
                       .ms = (rt_now() - t0) * 1e3, .items = items,
                       .accuracy = logits ? rt_accuracy(logits, labels, B, K) : NAN};
        if (rt_progress_step(r->progress, &s, err, sizeof err)) {
            fprintf(stderr, "fsexec: %s\n", err);
            return 1;
        }
        if (!isfinite(s.loss)) {
            end_progress(r);
            fprintf(stderr, "fsexec: step %" PRId64 ": the loss is %g; stopping (%s)\n", step, s.loss,
                    f->debug_nan ? "with --debug-nan this is a buffer read outside its planned live range: a bug "
                                   "in the plan"
                                 : "a lower learning rate may help; --debug-nan checks the plan's buffer reuse");
            return 1;
        }
    }
    return 0;
}

/* Files written after a long run are checked before it: their directory must be writable. */
static int check_output(const char *flag, const char *path)
{
    if (!path) return 0;
    const char *slash = strrchr(path, '/');
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", slash ? (slash == path ? 1 : (int)(slash - path)) : 1, slash ? path : ".");
    if (access(dir, W_OK) == 0) return 0;
    fprintf(stderr, "fsexec: %s %s: cannot write in %s: %s\n", flag, path, dir, strerror(errno));
    return -1;
}

static int run(const Flags *f)
{
    if (check_output("--save-weights", f->save_weights) || check_output("--save-grads", f->save_grads)) return 1;
    Plan *p = load(f->plan);
    if (!p) return 1;
    int64_t world = plan_meta_int(p, "world", 1);
    if (world > 1) {
        fprintf(stderr, "fsexec: %s: the plan is for %" PRId64 " ranks; multi-rank execution is not available yet "
                "(recompile with --world 1)\n", f->plan, world);
        plan_free(p);
        return 2;
    }
    rt_set_threads(f->threads);
    uint64_t seed = f->has_seed ? f->seed : (uint64_t)plan_meta_int(p, "seed", 0);
    char err[512];
    int rc = 1;
    Run r = {0};
    ExecOptions eo = {.seed = seed, .nan_fill = f->debug_nan};
    ProgressOptions po = {.steps = f->steps, .log_every = f->log_every, .log_path = f->log, .tty = -1};
    if (!(r.e = rt_exec_new(p, &eo, err, sizeof err))) {
        fprintf(stderr, "fsexec: %s: %s\n", f->plan, err);
    } else if (!(r.data = rt_data_open(r.e, f->data, f->order, seed, err, sizeof err))) {
        fprintf(stderr, "fsexec: %s\n", err);
    } else if (f->load_weights && rt_load_weights(r.e, f->load_weights, err, sizeof err)) {
        fprintf(stderr, "fsexec: %s\n", err);
    } else {
        po.unit = rt_data_get_kind(r.data) == RT_DATA_LM ? "tok" : "samples";
        if (f->steps && !(r.progress = rt_progress_new(&po, err, sizeof err))) {
            fprintf(stderr, "fsexec: %s\n", err);
        } else {
            start_line(p, &r, f, seed);
            rc = train(&r, f, f->plan);
            rc = end_progress(&r) || rc;
            if (!rc && f->save_weights && rt_save_weights(r.e, f->save_weights, f->steps, err, sizeof err)) {
                fprintf(stderr, "fsexec: %s\n", err);
                rc = 1;
            }
        }
    }
    run_free(&r);
    plan_free(p);
    return rc;
}

/* OpenMP threads that spin between parallel regions steal the cores OpenBLAS's threads
 * need (measured: GPT-2 124M at B=4, T=64 ran 2.5 s a step instead of 1.2 s on 2 cores).
 * libgomp reads its wait policy once, when it loads, before main: so unless the user
 * chose one, start again with the passive policy. */
static void passive_openmp(char **argv)
{
    if (getenv("OMP_WAIT_POLICY")) return;
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    execv("/proc/self/exe", argv);  // if that fails, run on with the default policy
}

int main(int argc, char **argv)
{
    passive_openmp(argv);
    Flags f = {0};
    int rc = parse_args(argc, argv, &f);
    if (rc) return rc;
    if (f.inspect) return inspect(f.inspect);
    return run(&f);
}
