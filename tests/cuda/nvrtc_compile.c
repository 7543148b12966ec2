/* tests/cuda/nvrtc_compile.c: every sample's CUDA module compiles with NVRTC, on a
 * machine without a GPU (NVRTC needs no driver).
 *
 *   nvrtc_compile SOURCE_DIR CUDA_INCLUDE_DIR
 *
 * The plans: every sample (each samples/NAME.fsm, at its own dims) in fp32, fp16 and bf16 with no
 * sharding, GPT-2 under fsdp at world 2 in bf16, GPT-2 with recompute Block, and the decode
 * programs (passes/decode.c: KV caches, rope_at, attention_decode) of GPT-2 and Llama, and
 * tests/cuda_emu/ops37.fsm (issue 37's op variants) in bf16 and, as two loss ops, fp16, and fp32 attention
 * under the tf32 setting (GPT-2, Llama, tests/cuda_emu/attn.fsm and attn_qkv.fsm at head dims 24 and 128, and
 * attn_mask.fsm's masked attentions). Each plan's
 * module (meta "cuda_source") is compiled for sm_80 and sm_90 as fsexec's CUDA backend
 * compiles it (-std=c++17, the toolkit's include directory); equal modules are compiled
 * once. A compile fails the test with NVRTC's log on any error or warning, and every
 * kernel a LAUNCH names must come out under that very name (nvrtcAddNameExpression, then
 * nvrtcGetLoweredName: the kernels are extern "C"). Besides, codegen/kernels/tc.cuh (the
 * tensor-core and async-copy functions) with the kernels of tests/cuda_emu/tc_kernels.cu,
 * which use every one of them, for both architectures. Compiles run on two threads.
 * The sm_90 compiles ask ptxas for its report (--ptxas-options=-v): every kernel's
 * registers, spills, stack and shared memory, and the blocks of its largest launch an
 * H100 / H200 SM can hold, are printed (tests/cuda/ptxas_report.c), with the top 10 by
 * spills and by registers; a kernel a LAUNCH names that the report lacks fails the test,
 * and so does a kernel made to spill (--maxrregcount) whose spills are not read.
 * Exit 0, or 1 on a failure.
 */
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nvrtc.h>

#include "codegen.h"
#include "cuda.h"
#include "frontend.h"
#include "passes.h"
#include "ptxas_report.h"

enum { MAX_JOBS = 80, MAX_PLANS = 64, MAX_SAMPLES = 16, THREADS = 2 };  // 3 plans a sample and the extra runs

typedef struct {
    char what[160];          // the plan and architecture, for messages
    const char *source;      // the module
    const char **names;      // the kernels its launches name
    int n_names;
    const char *arch;        // "sm_80"
    double seconds;
    int failed;
    PtxasKernel *ptxas;      // sm_90: ptxas -v's report of each entry function
    int n_ptxas;
} Job;

static const char *include_opt;
static Job jobs[MAX_JOBS];
static int n_jobs, next_job;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    *len = fread(buf, 1, (size_t)n, f);
    buf[*len] = 0;
    fclose(f);
    return buf;
}

/* g's decode program (g lowered with one sequence), planned; NULL after saying why. */
static Plan *decode_plan(const char *file, Graph *g, Options *o, Diag *d)
{
    int logits = -1;
    for (int n = 0; n < g->n_nodes; n++)
        if (g->nodes[n].op == OP_cross_entropy) logits = ir_in(g, &g->nodes[n], 0);
    Graph *dg = NULL;
    char err[600];
    Plan *p = NULL;
    passes_eval_identity(g);
    if (logits < 0 || passes_decode(g, logits, &dg, err, sizeof err))
        fprintf(stderr, "nvrtc_compile: %s has no decode program: %s\n", file, logits < 0 ? "no logits" : err);
    else if (!passes_run_forward(dg, o, d) && !(p = codegen_plan(dg, &o->train, err, sizeof err)))
        fprintf(stderr, "nvrtc_compile: %s's decode program: %s\n", file, err);
    ir_graph_free(dg);
    return p;
}

/* The plan of samples/file (a file with a directory: relative to the source tree) under
 * these settings (decode: its decode program, at B = 1), or NULL after saying why. */
static Plan *compile_plan(const char *dir, const char *file, const Setting *set, int n_set, int decode,
                          const Define *def, int n_def)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s%s", dir, strchr(file, '/') ? "" : "samples/", file);
    size_t len;
    char *src = read_file(path, &len), err[600];
    if (!src) {
        fprintf(stderr, "nvrtc_compile: cannot read %s\n", path);
        return NULL;
    }
    Diag d;
    diag_init(&d, file, src, len, stderr);
    const Define one = {"B", 1};
    FrontendOptions fo = {decode ? &one : def, decode ? 1 : n_def, set, n_set};
    Options o = {0};
    Graph *g = fe_compile(src, len, &fo, &o.train, &d);
    Plan *p = NULL;
    if (g && decode)
        p = decode_plan(file, g, &o, &d);
    else if (g && !passes_run(g, &o, &d) && !(p = codegen_plan(g, &o.train, err, sizeof err)))
        fprintf(stderr, "nvrtc_compile: %s: %s\n", file, err);
    ir_graph_free(g);
    free(src);
    return p;
}

static void log_of(nvrtcProgram prog, const Job *j)
{
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    char *log = malloc(n + 1);
    log[0] = 0;
    nvrtcGetProgramLog(prog, log);
    if (log[0]) fprintf(stderr, "%s: NVRTC says:\n%s\n", j->what, log);
    free(log);
}

static int has_warning(nvrtcProgram prog)
{
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    char *log = malloc(n + 1);
    log[0] = 0;
    nvrtcGetProgramLog(prog, log);
    int w = strstr(log, "warning") != NULL;
    free(log);
    return w;
}

/* sm_90's ptxas report from the log into j->ptxas; every kernel named must be in it. */
static void read_ptxas(nvrtcProgram prog, Job *j)
{
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    char *log = malloc(n + 1);
    log[0] = 0;
    nvrtcGetProgramLog(prog, log);
    if (ptxas_parse(log, &j->ptxas, &j->n_ptxas) < 0) {
        fprintf(stderr, "%s: ptxas's report is not as expected:\n%s\n", j->what, log);
        j->failed = 1;
    }
    free(log);
    for (int i = 0; i < j->n_names && !j->failed; i++) {
        int seen = 0;
        for (int k = 0; k < j->n_ptxas && !seen; k++) seen = !strcmp(j->ptxas[k].name, j->names[i]);
        if (!seen) fprintf(stderr, "%s: ptxas reports nothing of kernel %s\n", j->what, j->names[i]), j->failed = 1;
    }
}

static void run_job(Job *j)
{
    double t0 = now();
    nvrtcProgram prog;
    char arch[64];
    snprintf(arch, sizeof arch, "--gpu-architecture=%s", j->arch);
    int verbose = !strcmp(j->arch, "sm_90");
    const char *opts[] = {arch, "-std=c++17", include_opt, "--ptxas-options=-v"};
    if (nvrtcCreateProgram(&prog, j->source, "fsc_module.cu", 0, NULL, NULL) != NVRTC_SUCCESS) {
        fprintf(stderr, "%s: nvrtcCreateProgram failed\n", j->what);
        j->failed = 1;
        return;
    }
    for (int i = 0; i < j->n_names; i++) nvrtcAddNameExpression(prog, j->names[i]);
    nvrtcResult rc = nvrtcCompileProgram(prog, 3 + verbose, opts);
    if (rc != NVRTC_SUCCESS || has_warning(prog)) {
        fprintf(stderr, "%s: %s\n", j->what, rc != NVRTC_SUCCESS ? nvrtcGetErrorString(rc) : "warnings");
        log_of(prog, j);
        j->failed = 1;
    }
    for (int i = 0; i < j->n_names && !j->failed; i++) {
        const char *lowered = NULL;
        if (nvrtcGetLoweredName(prog, j->names[i], &lowered) != NVRTC_SUCCESS || strcmp(lowered, j->names[i])) {
            fprintf(stderr, "%s: kernel %s is not defined under its name (%s)\n", j->what, j->names[i], lowered ? lowered : "absent");
            j->failed = 1;
        }
    }
    if (verbose && !j->failed) read_ptxas(prog, j);
    nvrtcDestroyProgram(&prog);
    j->seconds = now() - t0;
}

static void *worker(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&lock);
        int k = next_job < n_jobs ? next_job++ : -1;
        pthread_mutex_unlock(&lock);
        if (k < 0) return NULL;
        run_job(&jobs[k]);
    }
}

/* The distinct kernel names of p's launches. */
static const char **kernel_names(const Plan *p, int *n)
{
    const char **names = malloc(sizeof *names * (size_t)(p->n_cuda + 1));
    *n = 0;
    for (int i = 0; i < p->n_cuda; i++) {
        if (p->cuda[i].kind != PLAN_CU_LAUNCH) continue;
        const char *s = plan_str(p, p->cuda[i].kernel);
        int seen = 0;
        for (int k = 0; k < *n && !seen; k++) seen = !strcmp(names[k], s);
        if (!seen) names[(*n)++] = s;
    }
    return names;
}

/* The tensor-core functions and their test kernels as one module, or NULL after saying why. */
static char *tc_module(const char *dir)
{
    static const char *const files[] = {"codegen/kernels/tc.cuh", "tests/cuda_emu/tc_kernels.cu"};
    size_t n = 0;
    char *out = calloc(1, 1);
    for (int f = 0; f < 2 && out; f++) {
        char path[1024];
        size_t len;
        snprintf(path, sizeof path, "%s/%s", dir, files[f]);
        char *text = read_file(path, &len), *grown;
        if (!text || !(grown = realloc(out, n + len + 1))) {
            fprintf(stderr, "nvrtc_compile: cannot read %s\n", path);
            free(text);
            free(out);
            return NULL;
        }
        out = grown;
        for (char *line = text, *end; *line; line = end) {
            end = strchr(line, '\n');
            end = end ? end + 1 : line + strlen(line);
            if (!strncmp(line, "#include \"", 10)) continue;
            memcpy(out + n, line, (size_t)(end - line));
            n += (size_t)(end - line);
        }
        out[n] = 0;
        free(text);
    }
    return out;
}

typedef struct {
    const char *file;
    Setting set[3];
    int n_set;
    int decode;  // the decode program
    Define def[3];  // -D dims
    int n_def;
} Run;

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The reader reads spills where ptxas reports them: 48 floats live at once in 24
 * registers (--maxrregcount) spill. 0, or -1 after saying why. */
static int ptxas_spills_read(void)
{
    static const char src[] = "extern \"C\" __global__ void spill(float *a)\n{\n    float v[48];\n#pragma unroll\n"
                              "    for (int i = 0; i < 48; i++) v[i] = a[threadIdx.x + i * 32];\n    float s = 0.f;\n"
                              "#pragma unroll\n    for (int i = 0; i < 48; i++) s += v[i] * v[(i * 7) % 48];\n"
                              "    a[threadIdx.x] = s;\n}\n";
    const char *opts[] = {"--gpu-architecture=sm_90", "--ptxas-options=-v", "--maxrregcount=24"};
    Job j = {.what = "the spilling kernel (sm_90)", .n_names = 1, .names = (const char *[]){"spill"}};
    nvrtcProgram prog;
    int ok = nvrtcCreateProgram(&prog, src, "spill.cu", 0, NULL, NULL) == NVRTC_SUCCESS;
    if (ok && nvrtcCompileProgram(prog, 3, opts) == NVRTC_SUCCESS) read_ptxas(prog, &j);
    else j.failed = 1;
    if (ok) nvrtcDestroyProgram(&prog);
    const PtxasKernel *k = j.n_ptxas == 1 ? &j.ptxas[0] : NULL;
    ok = !j.failed && k && k->regs == 24 && k->spill_stores > 0 && k->spill_loads > 0;
    if (!ok) fprintf(stderr, "nvrtc_compile: ptxas's report of a kernel that spills was not read as one\n");
    free(j.ptxas);
    return ok ? 0 : -1;
}

/* Every sm_90 job's kernels once, each with its largest launch in the plans; printed. */
static int report_ptxas(Plan *const *plans, int n_plans)
{
    PtxasKernel *all = NULL;
    int n = 0;
    for (int j = 0; j < n_jobs; j++)
        for (int k = 0; k < jobs[j].n_ptxas; k++) {
            int seen = 0;
            for (int i = 0; i < n && !seen; i++) seen = !strcmp(all[i].name, jobs[j].ptxas[k].name);
            if (seen) continue;
            PtxasKernel *grown = realloc(all, sizeof *all * (size_t)(n + 1));
            if (!grown) return free(all), -1;
            all = grown;
            all[n++] = jobs[j].ptxas[k];
        }
    for (int r = 0; r < n_plans; r++)
        for (int c = 0; c < plans[r]->n_cuda; c++) {
            const PlanCuda *in = &plans[r]->cuda[c];
            if (in->kind != PLAN_CU_LAUNCH) continue;
            int threads = in->block[0] * in->block[1] * in->block[2];
            for (int i = 0; i < n; i++)
                if (!strcmp(all[i].name, plan_str(plans[r], in->kernel))) {
                    if (threads > all[i].threads) all[i].threads = threads;
                    if (in->smem > all[i].dyn_smem) all[i].dyn_smem = in->smem;
                }
        }
    ptxas_print(all, n, stdout);
    free(all);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: nvrtc_compile SOURCE_DIR CUDA_INCLUDE_DIR\n");
        return 2;
    }
    char opt[1200], dirpath[1024];
    snprintf(opt, sizeof opt, "-I%s", argv[2]);
    include_opt = opt;
    double t0 = now();
    if (ptxas_spills_read()) return 1;

    /* the samples (samples/NAME.fsm), in name order */
    char *files[MAX_SAMPLES];
    int n_files = 0;
    snprintf(dirpath, sizeof dirpath, "%s/samples", argv[1]);
    DIR *dir = opendir(dirpath);
    if (!dir) {
        fprintf(stderr, "nvrtc_compile: cannot open %s\n", dirpath);
        return 1;
    }
    for (struct dirent *e; (e = readdir(dir));) {
        size_t n = strlen(e->d_name);
        if (n <= 4 || strcmp(e->d_name + n - 4, ".fsm")) continue;
        if (n_files == MAX_SAMPLES) {  // never a sample silently left out
            fprintf(stderr, "nvrtc_compile: more than %d samples in %s: raise MAX_SAMPLES\n", MAX_SAMPLES, dirpath);
            closedir(dir);
            return 1;
        }
        files[n_files++] = strdup(e->d_name);
    }
    closedir(dir);
    qsort(files, (size_t)n_files, sizeof *files, by_name);

    Run runs[MAX_PLANS];
    int n_runs = 0;
    static const char *const precisions[] = {"fp32", "fp16", "bf16"};
    for (int f = 0; f < n_files; f++)
        for (int k = 0; k < 3; k++)
            runs[n_runs++] = (Run){.file = files[f], .set = {{"precision", precisions[k]}}, .n_set = 1};
    runs[n_runs++] =
        (Run){.file = "gpt2.fsm", .set = {{"precision", "bf16"}, {"shard", "fsdp"}, {"world", "2"}}, .n_set = 3};
    runs[n_runs++] = (Run){.file = "gpt2.fsm", .set = {{"recompute", "Block"}}, .n_set = 1};
    runs[n_runs++] = (Run){.file = "gpt2.fsm", .set = {{"precision", "fp32"}}, .n_set = 1, .decode = 1};
    runs[n_runs++] = (Run){.file = "llama.fsm", .set = {{"precision", "fp32"}}, .n_set = 1, .decode = 1};
    /* issue 37's variants: exact GELU, pow, interleaved rope, ignore_index (fused; two ops), wsd */
    runs[n_runs++] =
        (Run){.file = "tests/cuda_emu/ops37.fsm", .set = {{"precision", "bf16"}, {"lr_schedule", "wsd"}}, .n_set = 2};
    runs[n_runs++] =
        (Run){.file = "tests/cuda_emu/ops37.fsm", .set = {{"precision", "fp16"}, {"fuse_loss", "0"}}, .n_set = 2};
    /* fp32 attention on TF32 tensor cores (the tf32 setting; codegen/cuda_flash.c): GPT-2's attention_qkv (head
     * dim 64), Llama's grouped-query attention, and head dims 24 (cross attention, T != S) and 128 */
    runs[n_runs++] = (Run){.file = "gpt2.fsm", .set = {{"precision", "fp32"}, {"tf32", "1"}}, .n_set = 2};
    runs[n_runs++] = (Run){.file = "llama.fsm", .set = {{"precision", "fp32"}, {"tf32", "1"}}, .n_set = 2};
    runs[n_runs++] = (Run){.file = "tests/cuda_emu/attn.fsm", .set = {{"tf32", "1"}}, .n_set = 1,
                           .def = {{"C", 96}, {"NH", 4}, {"NKV", 2}}, .n_def = 3};
    runs[n_runs++] = (Run){.file = "tests/cuda_emu/attn_qkv.fsm", .set = {{"tf32", "1"}}, .n_set = 1,
                           .def = {{"NH", 1}}, .n_def = 1};
    /* and masked: attention_masked and attention_qkv_masked, boolean and additive, causal and not */
    runs[n_runs++] = (Run){.file = "tests/cuda_emu/attn_mask.fsm", .set = {{"tf32", "1"}}, .n_set = 1};

    Plan *plans[MAX_PLANS];
    const char **names_of[MAX_PLANS] = {0};
    int modules = 0, kernels = 0;
    for (int r = 0; r < n_runs; r++) {
        Plan *p = plans[r] =
            compile_plan(argv[1], runs[r].file, runs[r].set, runs[r].n_set, runs[r].decode, runs[r].def, runs[r].n_def);
        if (!p) return 1;
        const char *src = codegen_cuda_source(p);
        if (!src) {
            fprintf(stderr, "nvrtc_compile: the plan of %s has no CUDA program\n", runs[r].file);
            return 1;
        }
        int n_names;
        const char **names = names_of[r] = kernel_names(p, &n_names);
        int launches = 0;
        for (int i = 0; i < p->n_cuda; i++) launches += p->cuda[i].kind == PLAN_CU_LAUNCH;
        char what[128] = "";
        if (runs[r].decode) snprintf(what, sizeof what, " (decode)");
        for (int s = 0; s < runs[r].n_set; s++)
            snprintf(what + strlen(what), sizeof what - strlen(what), " --%s %s", runs[r].set[s].key, runs[r].set[s].value);
        printf("%-10s%-40s %4d kernels, %5d launches, %4d GEMMs, %7zu bytes of CUDA C\n", runs[r].file, what, n_names,
               launches, p->n_cuda - launches, strlen(src));
        int dup = 0;
        for (int j = 0; j < n_jobs && !dup; j++) dup = !strcmp(jobs[j].source, src);
        if (dup) continue;  // an equal module: compiled once
        modules++, kernels += n_names;
        for (int a = 0; a < 2 && n_jobs < MAX_JOBS; a++) {
            Job *j = &jobs[n_jobs++];
            *j = (Job){.source = src, .names = names, .n_names = n_names, .arch = a ? "sm_90" : "sm_80"};
            snprintf(j->what, sizeof j->what, "%s%s (%s)", runs[r].file, what, j->arch);
        }
    }

    /* codegen/kernels/tc.cuh with the kernels of tests/cuda_emu/tc_kernels.cu that use all
     * of it, concatenated as a plan's module is (#include "..." lines dropped). */
    char *tc = tc_module(argv[1]);
    if (!tc) return 1;
    for (int a = 0; a < 2 && n_jobs < MAX_JOBS; a++) {
        Job *j = &jobs[n_jobs++];
        *j = (Job){.source = tc, .arch = a ? "sm_90" : "sm_80"};
        snprintf(j->what, sizeof j->what, "codegen/kernels/tc.cuh + tests/cuda_emu/tc_kernels.cu (%s)", j->arch);
    }

    pthread_t threads[THREADS];
    for (int t = 0; t < THREADS; t++) pthread_create(&threads[t], NULL, worker, NULL);
    for (int t = 0; t < THREADS; t++) pthread_join(threads[t], NULL);
    int failed = 0;
    double busiest = 0;
    for (int j = 0; j < n_jobs; j++) {
        failed += jobs[j].failed;
        if (jobs[j].seconds > busiest) busiest = jobs[j].seconds;
    }
    printf("%d plans, %d distinct modules (%d kernels), %d NVRTC compiles on %d threads (the longest %.2f s), %d failed; %.1f s in all\n",
           n_runs, modules, kernels, n_jobs, THREADS, busiest, failed, now() - t0);
    if (!failed && report_ptxas(plans, n_runs)) failed = 1;
    for (int j = 0; j < n_jobs; j++) free(jobs[j].ptxas);
    for (int r = 0; r < n_runs; r++) plan_free(plans[r]), free(names_of[r]);
    for (int f = 0; f < n_files; f++) free(files[f]);
    free(tc);
    return failed ? 1 : 0;
}
