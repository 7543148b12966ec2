/* tests/cuda_emu/module.c: a plan's CUDA module compiled for the CPU emulator.
 *
 * The translation unit is emu.hpp, then the module text exactly as codegen wrote it
 * (its #include <cuda_fp16.h> and <cuda_bf16.h> find the stand-ins in include/), then
 * EMU_KERNEL(name) for every kernel a LAUNCH names, which dlsym finds as emu_k_NAME. The
 * one change to the module's text: each `extern __shared__ T name[];` becomes a reference
 * to the launch's dynamic shared memory (emu.hpp cannot declare it through __shared__). It
 * is compiled with the system C++ compiler into a shared library whose file name is the
 * FNV-1a hash of the unit, the emulator's headers and the command, so an unchanged plan
 * is compiled once per cache directory. The unit is written with plan_write_atomic and
 * the library compiled under a temporary name and renamed into place, so concurrent
 * tests that compile the same module never see half of either.
 */
#include <dlfcn.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "emu_impl.h"

#ifndef FS_CUDA_EMU_DIR
#error "FS_CUDA_EMU_DIR: the directory of emu.hpp, set by tests/cuda_emu/cuda_emu.cmake"
#endif

extern char **environ;


/* A whole file into a NUL-terminated malloc'ed buffer, or NULL. */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            char *nb = realloc(buf, cap = (n + 4096 + 1) * 2);
            if (!nb) break;
            buf = nb;
        }
        size_t got = fread(buf + n, 1, 4096, f);
        n += got;
        if (got < 4096) break;
    }
    int bad = ferror(f) || !buf;
    fclose(f);
    if (bad) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

/* A growing string for the translation unit. */
typedef struct {
    char *s;
    size_t len, cap;
    int oom;
} Text;

static void addn(Text *t, const char *s, size_t n)
{
    if (t->oom) return;
    if (t->len + n + 1 > t->cap) {
        size_t cap = (t->len + n + 1) * 2;
        char *ns = realloc(t->s, cap);
        if (!ns) {
            t->oom = 1;
            return;
        }
        t->s = ns, t->cap = cap;
    }
    memcpy(t->s + t->len, s, n);
    t->len += n;
    t->s[t->len] = 0;
}

static void add(Text *t, const char *s) { addn(t, s, strlen(s)); }

/* The module's text with each `extern __shared__ T name[];` (dynamic shared memory, which
 * emu.hpp's __shared__, a static, cannot declare) turned into `T (&name)[] =
 * emu::dyn_shared;`, the launch's buffer. Lines stay where they were. A declaration of
 * another form is copied as it is, and the compiler says where. */
static void add_source(Text *t, const char *s)
{
    static const char key[] = "extern __shared__";
    const char *at;
    while ((at = strstr(s, key))) {
        const char *decl = at + sizeof key - 1, *semi = strchr(decl, ';'), *open = NULL;
        for (const char *c = decl; semi && c < semi; c++) open = *c == '[' ? c : open;
        const char *name = open, *close = open ? open + 1 : NULL;
        while (close && close < semi && *close == ' ') close++;
        while (name && name > decl && name[-1] == ' ') name--;
        const char *end = name;
        while (name && name > decl && (isalnum((unsigned char)name[-1]) || name[-1] == '_')) name--;
        if (!semi || !open || *close != ']' || name == end) {  // not the form above: as it is
            addn(t, s, (size_t)(decl - s));
            s = decl;
            continue;
        }
        addn(t, s, (size_t)(at - s));
        addn(t, decl, (size_t)(name - decl));
        add(t, "(&");
        addn(t, name, (size_t)(end - name));
        add(t, ")[] = emu::dyn_shared");
        s = close + 1;
    }
    add(t, s);
}

/* The unit: emu.hpp, the module, a trampoline per launched kernel (each once). */
static char *unit(const Plan *p, const char *source)
{
    Text t = {0};
    add(&t, "#include \"emu.hpp\"\n#line 1 \"kernels.cu\"\n");
    add_source(&t, source);
    add(&t, "\n// ---- trampolines (tests/cuda_emu/module.c) ----\n");
    for (int32_t i = 0; i < p->n_cuda; i++) {
        if (p->cuda[i].kind != PLAN_CU_LAUNCH) continue;
        int seen = 0;
        for (int32_t j = 0; j < i && !seen; j++) seen = p->cuda[j].kind == PLAN_CU_LAUNCH && p->cuda[j].kernel == p->cuda[i].kernel;
        if (seen) continue;
        add(&t, "EMU_KERNEL(");
        add(&t, plan_str(p, p->cuda[i].kernel));
        add(&t, ")\n");
    }
    if (t.oom) {
        free(t.s);
        return NULL;
    }
    return t.s;
}

static int mkdirs(char *path)
{
    for (char *s = path + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        int rc = mkdir(path, 0700);
        *s = '/';
        if (rc && errno != EEXIST) return -1;
    }
    return mkdir(path, 0700) && errno != EEXIST ? -1 : 0;
}

static int cache_dir(char *dir, size_t n)
{
    const char *env = getenv("FS_CUDA_EMU_CACHE"), *tmp = getenv("TMPDIR");
    if (env && *env) snprintf(dir, n, "%s", env);
    else snprintf(dir, n, "%s/fs_cudaemu-%d", tmp && *tmp ? tmp : "/tmp", (int)getuid());
    return mkdirs(dir);
}

/* Runs argv with stdout and stderr into log: its exit status, or -1. */
static int run(char *const argv[], const char *log)
{
    posix_spawn_file_actions_t fa;
    pid_t pid;
    int status = 0;
    if (posix_spawn_file_actions_init(&fa)) return -1;
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc) return -1;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* The compiler's options. UBSan, fatal: an index past a __shared__ array, a misaligned
 * vector load, an int index that overflows are errors on a GPU too, and show here with
 * kernels.cu:LINE. No contraction: a GPU's FMAs differ by an ulp, not by more. GCC's
 * ThreadSanitizer instrumentation, without its runtime (the link drops it): a call of
 * __tsan_readN/__tsan_writeN before every access to memory, which emu_observe.hpp
 * defines to measure the kernel's accesses; no SRA, so a vector copied whole stays one
 * access as a GPU's vector load is. Data sections, so the link's script (emu_shared.ld)
 * gathers every __shared__ variable into one range. The compile makes an object, the
 * link the library. */
static const char *const FLAGS[] = {"-std=c++17", "-O1", "-fPIC", "-w", "-ffp-contract=off",
                                    "-fsanitize=undefined", "-fno-sanitize=vptr", "-fno-sanitize-recover=all",
                                    "-fdata-sections",
                                    "-I" FS_CUDA_EMU_DIR, "-I" FS_CUDA_EMU_DIR "/include"};
/* The measuring instrumentation makes kernels 3 to 4 times slower, so a run that reads no
 * measures (fsexec training on the emulator, tests/cuda_emu/train.py) turns it off with
 * FS_CUDA_EMU_MEASURE=0; then the table of measures is empty. */
static const char *const OBSERVE[] = {"-fsanitize=thread", "--param=tsan-instrument-func-entry-exit=0",
                                      "-fno-tree-sra"};
static const char *const LINK[] = {"-shared", "-fsanitize=undefined", "-Wl,-T," FS_CUDA_EMU_DIR "/emu_shared.ld"};
enum { N_FLAGS = sizeof FLAGS / sizeof *FLAGS, N_OBSERVE = sizeof OBSERVE / sizeof *OBSERVE,
       N_LINK = sizeof LINK / sizeof *LINK };

static int measuring(void)
{
    const char *e = getenv("FS_CUDA_EMU_MEASURE");
    return !e || strcmp(e, "0");
}

static int compile(const char *cxx, const char *cpp, const char *so, const char *log, char *err, size_t errlen)
{
    char *argv[N_FLAGS + N_OBSERVE + N_LINK + 6], obj[1200];
    snprintf(obj, sizeof obj, "%s.o", so);
    int n = 0, rc;
    argv[n++] = (char *)cxx;
    for (int i = 0; i < N_FLAGS; i++) argv[n++] = (char *)FLAGS[i];
    for (int i = 0; measuring() && i < N_OBSERVE; i++) argv[n++] = (char *)OBSERVE[i];
    argv[n++] = "-c", argv[n++] = "-o", argv[n++] = obj, argv[n++] = (char *)cpp, argv[n] = NULL;
    if (!(rc = run(argv, log))) {
        n = 0;
        argv[n++] = (char *)cxx;
        for (int i = 0; i < N_LINK; i++) argv[n++] = (char *)LINK[i];
        argv[n++] = "-o", argv[n++] = (char *)so, argv[n++] = obj, argv[n] = NULL;
        rc = run(argv, log);
    }
    unlink(obj);
    if (!rc) return 0;
    char *out = slurp(log, NULL);
    plan_fail(err, errlen, "%s %s: %s%s%.1500s", cxx, cpp, rc < 0 ? "cannot run it" : "failed",
              out && *out ? ":\n" : "", out ? out : "");
    free(out);
    return -1;
}

int emu_module_load(const Plan *p, EmuModule *m, char *err, size_t errlen)
{
    const char *source = p->cuda_module, *cxx = getenv("FS_CUDA_EMU_CXX");
    static const char *const headers[] = {"emu.hpp",       "emu_abi.h",           "emu_observe.hpp",    "emu_tc.hpp",
                                          "emu_shared.ld", "include/cuda_fp16.h", "include/cuda_bf16.h"};
    memset(m, 0, sizeof *m);
    if (!source) return plan_fail(err, errlen, "the plan has no CUDA module (section CUMD)");
    if (!cxx || !*cxx) cxx = "c++";
    snprintf(m->compiler, sizeof m->compiler, "%s -O1 -fsanitize=undefined%s", cxx, measuring() ? ",thread" : "");
    char *tu = unit(p, source);
    if (!tu) return plan_fail(err, errlen, "out of memory");
    uint64_t h = plan_fnv1a(PLAN_FNV1A_INIT, tu, strlen(tu));
    h = plan_fnv1a(h, cxx, strlen(cxx) + 1);
    for (int i = 0; i < N_FLAGS; i++) h = plan_fnv1a(h, FLAGS[i], strlen(FLAGS[i]) + 1);
    for (int i = 0; measuring() && i < N_OBSERVE; i++) h = plan_fnv1a(h, OBSERVE[i], strlen(OBSERVE[i]) + 1);
    for (int i = 0; i < N_LINK; i++) h = plan_fnv1a(h, LINK[i], strlen(LINK[i]) + 1);
    for (size_t i = 0; i < sizeof headers / sizeof *headers; i++) {
        char path[1024];
        size_t n = 0;
        snprintf(path, sizeof path, "%s/%s", FS_CUDA_EMU_DIR, headers[i]);
        char *text = slurp(path, &n);
        if (!text) {
            free(tu);
            return plan_fail(err, errlen, "cannot read %s: %s", path, strerror(errno));
        }
        h = plan_fnv1a(h, text, n);
        free(text);
    }
    char dir[900], cpp[1024], tmp_so[1100], log[1100], why[300];
    if (cache_dir(dir, sizeof dir)) {
        free(tu);
        return plan_fail(err, errlen, "cannot make the cache directory %s: %s", dir, strerror(errno));
    }
    snprintf(m->path, sizeof m->path, "%s/%016llx.so", dir, (unsigned long long)h);
    snprintf(cpp, sizeof cpp, "%s/%016llx.cpp", dir, (unsigned long long)h);
    snprintf(m->cpp, sizeof m->cpp, "%s", cpp);
    m->from_cache = access(m->path, R_OK) == 0;
    if (!m->from_cache) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int pid = (int)getpid();
        snprintf(tmp_so, sizeof tmp_so, "%s.%d.so", m->path, pid);
        snprintf(log, sizeof log, "%s.%d.log", m->path, pid);
        PlanChunk text = {tu, strlen(tu)};
        int rc = plan_write_atomic(cpp, &text, 1, why, sizeof why) ? plan_fail(err, errlen, "%s: %s", cpp, why)
                                                                   : compile(cxx, cpp, tmp_so, log, err, errlen);
        if (!rc && rename(tmp_so, m->path))
            rc = plan_fail(err, errlen, "cannot rename into %s: %s", dir, strerror(errno));
        if (!rc) unlink(log);
        unlink(tmp_so);
        if (rc) {  // the unit and the log stay for a look at what failed
            free(tu);
            return -1;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        m->seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    }
    free(tu);
    m->so = dlopen(m->path, RTLD_NOW | RTLD_LOCAL);
    if (!m->so) return plan_fail(err, errlen, "dlopen %s: %s", m->path, dlerror());
    *(void **)&m->launch = dlsym(m->so, "emu_launch");
    if (!m->launch) {
        emu_module_close(m);
        return plan_fail(err, errlen, "%s has no emu_launch (not made by this emulator)", m->path);
    }
    return 0;
}

EmuTramp emu_module_kernel(const EmuModule *m, const char *name)
{
    char sym[256];
    EmuTramp t;
    snprintf(sym, sizeof sym, "emu_k_%s", name);
    *(void **)&t = dlsym(m->so, sym);
    return t;
}

void emu_module_close(EmuModule *m)
{
    if (m->so) dlclose(m->so);
    m->so = NULL;
    m->launch = NULL;
}
