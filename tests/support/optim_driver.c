/* tests/support/optim_driver.c: runs the host optimizer kernels (cpu_adamw, cpu_sgd of
 * runtime/cpu/optim.c) on raw float32 files, for tests/py/host_optim.py (against
 * torch.optim, across thread counts and ISAs) and bench/host_adamw.py (speed against
 * the machine's memory bandwidth).
 *
 *   optim_driver adamw N FIRST STEPS LR BETA1 BETA2 EPS WD COEF IN OUT
 *   optim_driver sgd N FIRST STEPS LR MOMENTUM WD COEF IN OUT
 *   optim_driver bench N REPS
 *
 * adamw and sgd take steps FIRST .. FIRST + STEPS - 1 (1-based: AdamW's bias
 * corrections, SGD's first momentum step). IN holds p and the state (p, m, v for
 * adamw; p, buf for sgd; N floats each), then STEPS gradients of N floats; OUT gets p
 * and the state after the last step. bench prints one JSON line of seconds per run,
 * REPS runs each: an AdamW step on N params, a memcpy of 4N bytes, and a loop with
 * AdamW's memory traffic but only adds. OMP_NUM_THREADS sets the threads.
 *
 * Built twice over (CMakeLists.txt): optim_driver on the fs_cpu library, whose loops
 * pick their ISA when the program loads; optim_driver_<isa> on optim.c built for one
 * ISA alone (FS_OPTIM_ISA names it), which exits 77 on a CPU without that ISA. The test
 * compares them bit for bit.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

/* A fatal error of the driver's own (bad arguments, files): say what, and exit 2. */
static void die(const char *what, const char *arg)
{
    fprintf(stderr, "optim_driver: %s%s%s\n", what, arg ? ": " : "", arg ? arg : "");
    exit(2);
}

static float *floats(int64_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, (size_t)n * sizeof(float)) != 0) die("out of memory", NULL);
    return p;
}

static KTensor vec(float *x, int64_t n)
{
    return (KTensor){.data = x, .dtype = KT_F32, .rank = 1, .shape = {n}, .numel = n};
}
static KTensor fscalar(float *x) { return (KTensor){.data = x, .dtype = KT_F32, .numel = 1}; }
static KTensor iscalar(int32_t *x) { return (KTensor){.data = x, .dtype = KT_I32, .numel = 1}; }

/* count arrays of n floats, then the gradients (steps n floats). */
static void load(const char *path, float *const *arrays, int count, int64_t n, float *g, int64_t steps)
{
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open", path);
    for (int i = 0; i < count; i++)
        if (fread(arrays[i], sizeof(float), (size_t)n, f) != (size_t)n) die("short file", path);
    if (fread(g, sizeof(float), (size_t)(n * steps), f) != (size_t)(n * steps)) die("short file", path);
    fclose(f);
}

static void save(const char *path, float *const *arrays, int count, int64_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) die("cannot create", path);
    for (int i = 0; i < count; i++)
        if (fwrite(arrays[i], sizeof(float), (size_t)n, f) != (size_t)n) die("cannot write", path);
    if (fclose(f) != 0) die("cannot write", path);
}

static double num(const char *s)
{
    char *end;
    double x = strtod(s, &end);
    if (end == s || *end) die("not a number", s);
    return x;
}

/* adamw N FIRST STEPS LR BETA1 BETA2 EPS WD COEF IN OUT */
static void run_adamw(char **a)
{
    int64_t n = (int64_t)num(a[0]), first = (int64_t)num(a[1]), steps = (int64_t)num(a[2]);
    float lr = (float)num(a[3]), coef = (float)num(a[8]);
    double b1 = num(a[4]), b2 = num(a[5]), eps = num(a[6]), wd = num(a[7]);
    float *p = floats(n), *g = floats(n * steps), *m = floats(n), *v = floats(n);
    load(a[9], (float *[]){p, m, v}, 3, n, g, steps);
    for (int32_t step = (int32_t)first; step < first + steps; step++) {
        KTensor gs = vec(g + (step - first) * n, n);
        KCall k = {.n_in = 7,
                   .in = {vec(p, n), gs, vec(m, n), vec(v, n), fscalar(&lr), fscalar(&coef), iscalar(&step)},
                   .attr = {[7] = b1, [8] = b2, [9] = eps, [10] = wd}};
        cpu_adamw(&k);
    }
    save(a[10], (float *[]){p, m, v}, 3, n);
    free(p), free(g), free(m), free(v);
}

/* sgd N FIRST STEPS LR MOMENTUM WD COEF IN OUT */
static void run_sgd(char **a)
{
    int64_t n = (int64_t)num(a[0]), first = (int64_t)num(a[1]), steps = (int64_t)num(a[2]);
    float lr = (float)num(a[3]), coef = (float)num(a[6]);
    double mom = num(a[4]), wd = num(a[5]);
    float *p = floats(n), *g = floats(n * steps), *buf = floats(n);
    load(a[7], (float *[]){p, buf}, 2, n, g, steps);
    for (int32_t step = (int32_t)first; step < first + steps; step++) {
        KTensor gs = vec(g + (step - first) * n, n);
        KCall k = {.n_in = 6,
                   .in = {vec(p, n), gs, vec(buf, n), fscalar(&lr), fscalar(&coef), iscalar(&step)},
                   .attr = {[6] = mom, [7] = wd}};
        cpu_sgd(&k);
    }
    save(a[8], (float *[]){p, buf}, 2, n);
    free(p), free(g), free(buf);
}

/* ---- bench ---------------------------------------------------------------------------- */

/* Each thread touches first the pages it will update (the kernels' static schedule). */
static void fill(float *x, int64_t n, float scale)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) x[i] = scale * (float)((i * 2654435761u) % 1000u + 1u);
}

static void time_adamw(float *p, float *g, float *m, float *v, int64_t n, int reps, double *sec)
{
    float lr = 1e-3f, coef = 1.0f;
    for (int32_t r = 0; r < reps; r++) {
        int32_t step = r + 1;
        KCall k = {.n_in = 7,
                   .in = {vec(p, n), vec(g, n), vec(m, n), vec(v, n), fscalar(&lr), fscalar(&coef), iscalar(&step)},
                   .attr = {[7] = 0.9, [8] = 0.999, [9] = 1e-8, [10] = 0.01}};
        double t0 = omp_get_wtime();
        cpu_adamw(&k);
        sec[r] = omp_get_wtime() - t0;
    }
}

/* memcpy of n floats, each thread its contiguous share. */
static void time_copy(float *dst, const float *src, int64_t n, int reps, double *sec)
{
    for (int r = 0; r < reps; r++) {
        double t0 = omp_get_wtime();
#pragma omp parallel
        {
            int64_t T = omp_get_num_threads(), t = omp_get_thread_num();
            int64_t i0 = n * t / T, i1 = n * (t + 1) / T;
            memcpy(dst + i0, src + i0, (size_t)(i1 - i0) * sizeof(float));
        }
        sec[r] = omp_get_wtime() - t0;
    }
}

/* AdamW's traffic (read p, g, m, v; write p, m, v) with an add or two per element. */
static void time_streams(float *p, const float *g, float *m, float *v, int64_t n, int reps, double *sec)
{
    for (int r = 0; r < reps; r++) {
        double t0 = omp_get_wtime();
#pragma omp parallel for simd schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float gi = g[i];
            m[i] += gi, v[i] += gi;
            p[i] -= m[i] + v[i];
        }
        sec[r] = omp_get_wtime() - t0;
    }
}

static void print_list(const char *name, const double *x, int n, const char *sep)
{
    printf("\"%s\": [", name);
    for (int i = 0; i < n; i++) printf("%s%.6f", i ? ", " : "", x[i]);
    printf("]%s", sep);
}

/* bench N REPS */
static void run_bench(char **a)
{
    int64_t n = (int64_t)num(a[0]);
    int reps = (int)num(a[1]);
    if (n < 1 || reps < 1 || reps > 1000) die("bench: N and REPS must be positive (REPS at most 1000)", NULL);
    float *p = floats(n), *g = floats(n), *m = floats(n), *v = floats(n);
    double adamw[1000], copy[1000], streams[1000];
    fill(p, n, 1e-3f), fill(g, n, 1e-4f), fill(m, n, 0.0f), fill(v, n, 0.0f);
    time_adamw(p, g, m, v, n, reps, adamw);
    time_copy(m, g, n, reps, copy);
    time_streams(p, g, m, v, n, reps, streams);
    printf("{\"n\": %lld, \"threads\": %d, ", (long long)n, omp_get_max_threads());
    print_list("adamw_s", adamw, reps, ", ");
    print_list("copy_s", copy, reps, ", ");
    print_list("streams_s", streams, reps, "}\n");
    free(p), free(g), free(m), free(v);
}

int main(int argc, char **argv)
{
#ifdef FS_OPTIM_ISA
    __builtin_cpu_init();
    if (!__builtin_cpu_supports(FS_OPTIM_ISA)) {
        fprintf(stderr, "optim_driver: this CPU has no %s\n", FS_OPTIM_ISA);
        return 77;
    }
#endif
    if (argc == 13 && !strcmp(argv[1], "adamw")) {
        run_adamw(argv + 2);
    } else if (argc == 11 && !strcmp(argv[1], "sgd")) {
        run_sgd(argv + 2);
    } else if (argc == 4 && !strcmp(argv[1], "bench")) {
        run_bench(argv + 2);
    } else {
        die("usage: optim_driver adamw N FIRST STEPS LR BETA1 BETA2 EPS WD COEF IN OUT\n"
            "       optim_driver sgd N FIRST STEPS LR MOMENTUM WD COEF IN OUT\n"
            "       optim_driver bench N REPS",
            NULL);
    }
    return 0;
}
