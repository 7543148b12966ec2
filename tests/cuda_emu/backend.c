/* tests/cuda_emu/backend.c: cuda-emu, the CUDA backend's table (runtime/backend.h) run
 * on the CPU, so tests/cuda/op_check.c checks every kernel of a real plan in CI, where
 * no GPU is. Built as libfs_cudaemu.so (tests/cuda_emu/cuda_emu.cmake), loaded through
 * FS_CUDA_BACKEND; test infrastructure, never part of fsexec. A world of more than one
 * rank (data-parallel ranks, pipeline stages) runs NCCL's calls over MPI (nccl_emu.c).
 *
 * The "device" arena is a malloc'ed copy of the host arena. The plan is bound by the
 * CUDA backend's own schedule (runtime/cuda/schedule.c): LAUNCH argument offsets, the
 * cuBLAS form of every GEMM, collectives. Then each op's instructions run in order:
 *
 * LAUNCH: the kernel of the compiled module (module.c) runs in emu.hpp's emulator.
 *   Each launch gets its arguments in mappings of their own: the argument tensors
 *   (those whose bytes overlap share one) copied between two inaccessible MiB, with
 *   64 or more bytes of canary (0xff: NaN in every float type) before them and less
 *   than 64 after, at the same alignment modulo 64 as in the arena. So an access that
 *   strays into a guard faults (the handler names the kernel, op and tensor), a write
 *   into the slack shows as changed canary bytes, a read of it gets NaN, never another
 *   tensor's data, and nothing outside its arguments can change. By default
 *   (FS_CUDA_EMU_ORDER=both) every launch runs twice from the same bytes, blocks and
 *   threads in forward then in reverse order, and the two results must be equal to the
 *   bit: a kernel whose result depends on the order of threads between barriers (a
 *   race) fails. forward or reverse runs one order. Checked besides: the kernel takes
 *   exactly the launch's pointers; no two overlapping arguments of which one is written
 *   and one __restrict__ (by the kernel's signature in the source); and UBSan, built
 *   into the compiled kernels (module.c), stops at a __shared__ index past its array, a
 *   misaligned vector load or an int index that overflows, the SIGABRT handler here
 *   naming the op. The launch's dynamic shared memory (up to 227 KiB) is the emulator's.
 *   The first run of each launch is observed (emu_observe.hpp): its global-memory
 *   sectors per warp access against the fewest possible and its shared-memory bank
 *   conflicts, summed per kernel, are the table `measures` gives op_check.
 * GEMM: exactly the call cublasGemmStridedBatchedEx would get (schedule.c: cs_gemm, the
 *   column-major form), refused where cuBLAS refuses it (leading dimensions, mixed
 *   operand dtypes, operands outside their tensors, C overlapping A or B), computed as
 *   cuBLAS does with CUBLAS_COMPUTE_32F: f32 products and sums, C rounded once. A GEMM
 *   with an epilogue or a residual (beta 1) is the cublasLtMatmul the CUDA backend makes
 *   (runtime/cuda/lt.c): the residual and the epilogue on the f32 accumulator, refused
 *   where cuBLASLt has no algorithm.
 * Collectives over one rank: a copy when out is not in (runtime/cpu/comm_local.c); over
 *   more, and sends and receives: nccl_emu.c's, started when reached and completed where
 *   the stored waits name them (as the CUDA backend's events order them) or at the end
 *   of the run.
 * Offload: to_host and to_device copy between the arena and the host space (the
 *   mirror's); an op of the host space runs on the host mirror (RtBackendOptions.host_op).
 * --cuda-graph: the first graph step captures the step as run.c does, its host ops as
 *   host-function nodes, each recorded as early as the graph's edges let it run (ahead
 *   of device work the plan puts before it: graph.c), and every graph step replays the
 *   recording.
 */
#define _DEFAULT_SOURCE  // MAP_ANONYMOUS
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "emu_impl.h"
#include "nccl_emu.h"
#include "schedule.h"

/* GUARD: inaccessible bytes on each side of a launch's argument group; an index that
 * strays less than that far from its tensor faults (the address space costs nothing). */
enum { ORDER_FORWARD = 1, ORDER_REVERSE = 2, MAX_ARGS = 64, CANARY = 0xff, ALIGN = 64, GUARD = 1 << 20 };

/* What a kernel's signature says of its pointer parameters, bit i for parameter i. */
typedef struct {
    uint64_t restrict_, konst;  // declared __restrict__; pointer to const
} Params;

/* What the emulator measured of one kernel (emu_observe.hpp), summed over its launches. */
typedef struct {
    int32_t kernel;         // its name (plan string)
    int launches;
    EmuMeasure m;
} KernelMeasure;

struct RtBackend {
    const Plan *plan;
    int rank;
    EmuNccl *nccl;          // a world of more than one rank: NCCL over MPI
    int64_t to_host, to_device;  // the bytes offload's copies moved since it was made
    uint8_t *arena;
    int64_t arena_bytes;
    uint8_t *host;          // the plan's host space (offload), the mirror's: copies go to and from it
    int (*host_op)(void *ctx, int32_t op);
    void *host_ctx;
    CsSchedule s;
    EmuModule mod;
    EmuTramp *tramp;        // per instruction (LAUNCH)
    Params *params;         // per instruction (LAUNCH): its kernel's parameters
    int order;              // ORDER_FORWARD | ORDER_REVERSE
    long page;
    int32_t cur_op;         // for messages; -1 outside ops
    KernelMeasure *measured;// per kernel (by name) run so far: n_measured of them
    int32_t n_measured;
    char *table;            // the last table `measures` made
    RtBackendInfo info;
    EmuGraph *graph;        // --cuda-graph: the captured step (graph.c), replayed; NULL before its capture
    char err[4096];
};

__attribute__((format(printf, 2, 3))) static int failf(RtBackend *b, const char *fmt, ...)
{
    char where[300] = "", msg[3500];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (b->cur_op >= 0) cs_op_where(b->plan, b->cur_op, where, sizeof where);
    snprintf(b->err, sizeof b->err, "[rank %d] cuda-emu: %s%s%s", b->rank, where, *where ? ": " : "", msg);
    return -1;
}

/* ---- a launch's arguments, in guarded mappings ---------------------------------------- */

/* Arguments whose bytes overlap, as one range of the arena in one mapping. */
typedef struct {
    int64_t lo, hi;         // arena bytes
    uint8_t *map;           // the mapping: GUARD bytes, data_bytes, GUARD bytes, the guards inaccessible
    size_t map_bytes;
    uint8_t *data;          // map + GUARD: [0, start) canary, the arena's bytes, canary from end to data_bytes
    size_t data_bytes, start, end;
} Group;

typedef struct {
    const RtBackend *b;
    const PlanCuda *c;
    int n_args;
    int64_t lo[MAX_ARGS], hi[MAX_ARGS];
    int group_of[MAX_ARGS];
    Group groups[MAX_ARGS];
    int n_groups;
} Launch;

static const Launch *faulting;  // the launch running, for the fault handler

static void group_free(Group *g)
{
    if (g->map) munmap(g->map, g->map_bytes);
    g->map = NULL;
}

/* A mapping for g's bytes, the data copied in from the arena. */
static int group_map(const RtBackend *b, Group *g)
{
    size_t n = (size_t)(g->hi - g->lo), page = (size_t)b->page;
    size_t bytes = (n + 2 * ALIGN + page - 1) / page * page;
    size_t start = bytes - n, want = (size_t)(g->lo % ALIGN);
    start -= (start + ALIGN - want) % ALIGN;  // start = lo modulo ALIGN, as in the arena
    g->map_bytes = GUARD + bytes + GUARD, g->data_bytes = bytes, g->start = start, g->end = start + n;
    g->map = mmap(NULL, g->map_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (g->map == MAP_FAILED) return g->map = NULL, -1;
    g->data = g->map + GUARD;
    if (mprotect(g->data, bytes, PROT_READ | PROT_WRITE)) return -1;
    memset(g->data, CANARY, bytes);
    memcpy(g->data + start, b->arena + g->lo, n);
    return 0;
}

/* Groups of overlapping args (each arg in the group of the first arg it overlaps). */
static void make_groups(Launch *L)
{
    L->n_groups = 0;
    for (int a = 0; a < L->n_args; a++) {
        int g = -1;
        for (int k = 0; k < L->n_groups && g < 0; k++)
            if (L->lo[a] < L->groups[k].hi && L->groups[k].lo < L->hi[a]) g = k;
        if (g < 0) {
            g = L->n_groups++;
            L->groups[g] = (Group){.lo = L->lo[a], .hi = L->hi[a]};
        }
        if (L->lo[a] < L->groups[g].lo) L->groups[g].lo = L->lo[a];
        if (L->hi[a] > L->groups[g].hi) L->groups[g].hi = L->hi[a];
        L->group_of[a] = g;
    }
    /* A widened group can now overlap another: merge until none does. */
    for (int merged = 1; merged;) {
        merged = 0;
        for (int i = 0; i < L->n_groups && !merged; i++)
            for (int j = i + 1; j < L->n_groups && !merged; j++) {
                Group *gi = &L->groups[i], *gj = &L->groups[j];
                if (!(gi->lo < gj->hi && gj->lo < gi->hi)) continue;
                if (gj->lo < gi->lo) gi->lo = gj->lo;
                if (gj->hi > gi->hi) gi->hi = gj->hi;
                for (int a = 0; a < L->n_args; a++) L->group_of[a] = L->group_of[a] == j ? i : L->group_of[a] > j ? L->group_of[a] - 1 : L->group_of[a];
                memmove(&L->groups[j], &L->groups[j + 1], sizeof *L->groups * (size_t)(L->n_groups - j - 1));
                L->n_groups--, merged = 1;
            }
    }
}

/* The tensor (by arg) whose bytes hold arena byte x, for messages. */
static int arg_at(const Launch *L, int64_t x)
{
    for (int a = 0; a < L->n_args; a++)
        if (x >= L->lo[a] && x < L->hi[a]) return a;
    return -1;
}

static const char *arg_name(const Launch *L, int a, char *buf, size_t n)
{
    const Plan *p = L->b->plan;
    if (a < 0) return snprintf(buf, n, "an empty argument"), buf;
    int32_t id = p->ids[L->c->args + a];
    const char *name = plan_str(p, p->tensors[id].name);
    snprintf(buf, n, "argument %d (tensor %d %s, %s)", a, id, *name ? name : "unnamed", plan_dtype_name(p->tensors[id].dtype));
    return buf;
}

/* An access outside every mapping of the launch (past a tensor's end), or UBSan's abort
 * (its message is out already): say which kernel of which op, die. */
static void on_fault(int sig, siginfo_t *si, void *ctx)
{
    (void)ctx;
    const Launch *L = faulting;
    char buf[2048], what[1200] = "outside its arguments", an[200], where[300] = "";
    if (sig == SIGABRT && L)
        snprintf(what, sizeof what, "the error above (kernels.cu as fsc --emit cuda writes it; compiled as %s)",
                 L->b->mod.cpp);
    uint8_t *x = si->si_addr;
    for (int g = 0; L && g < L->n_groups; g++) {
        const Group *gr = &L->groups[g];
        if (x >= gr->data + gr->data_bytes && x < gr->map + gr->map_bytes)
            snprintf(what, sizeof what, "%lld bytes past the end of %s", (long long)(x - (gr->data + gr->end)),
                     arg_name(L, arg_at(L, gr->hi - 1), an, sizeof an));
        if (x >= gr->map && x < gr->data)
            snprintf(what, sizeof what, "%lld bytes before the start of %s", (long long)(gr->data + gr->start - x),
                     arg_name(L, arg_at(L, gr->lo), an, sizeof an));
    }
    if (L) cs_op_where(L->b->plan, L->c->op, where, sizeof where);
    int n = sig == SIGABRT ? snprintf(buf, sizeof buf, "[rank %d] cuda-emu: %s: kernel %s stopped on %s\n", L ? L->b->rank : 0,
                                      where, L ? plan_str(L->b->plan, L->c->kernel) : "?", what)
                           : snprintf(buf, sizeof buf, "[rank %d] cuda-emu: %s: kernel %s touched %p, %s (signal %d)\n",
                                      L ? L->b->rank : 0, where, L ? plan_str(L->b->plan, L->c->kernel) : "?",
                                      si->si_addr, what, sig);
    if (write(2, buf, (size_t)(n > 0 && n < (int)sizeof buf ? n : 0)) < 0) {}
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Written canary bytes: a write before or after an argument group. */
static int check_canaries(RtBackend *b, const Launch *L, const Group *g)
{
    for (size_t i = 0; i < g->data_bytes; i++) {
        if (i == g->start) i = g->end;
        if (i >= g->data_bytes || g->data[i] == CANARY) continue;
        char an[200];
        int before = i < g->start;
        int a = arg_at(L, before ? g->lo : g->hi - 1);
        return failf(b, "kernel %s wrote %zu bytes %s %s", plan_str(b->plan, L->c->kernel),
                     before ? g->start - i : i - g->end + 1, before ? "before" : "past the end of",
                     arg_name(L, a, an, sizeof an));
    }
    return 0;
}

/* Two arguments whose bytes overlap, one of them written, are undefined behaviour when
 * either parameter is __restrict__: the GPU compiler may serve the reads from its
 * read-only cache, or reorder them past the writes. The emulator would not show it. */
static int check_aliasing(RtBackend *b, const Launch *L, const Params *pr)
{
    for (int a = 0; a < L->n_args; a++)
        for (int o = a + 1; o < L->n_args; o++) {
            if (!(L->lo[a] < L->hi[o] && L->lo[o] < L->hi[a])) continue;
            uint64_t ma = (uint64_t)1 << a, mo = (uint64_t)1 << o;
            if (!((pr->restrict_ & (ma | mo)) && (~pr->konst & (ma | mo)))) continue;
            char na[200], no[200];
            return failf(b, "kernel %s: %s and %s overlap, one is written, and one is __restrict__ (undefined on a GPU)",
                         plan_str(b->plan, L->c->kernel), arg_name(L, a, na, sizeof na), arg_name(L, o, no, sizeof no));
        }
    return 0;
}

/* The launch's measures added to its kernel's. */
static void add_measure(RtBackend *b, int32_t kernel, const EmuMeasure *m)
{
    KernelMeasure *k = b->measured;
    while (k < b->measured + b->n_measured && k->kernel != kernel) k++;
    if (k == b->measured + b->n_measured) *k = (KernelMeasure){.kernel = kernel}, b->n_measured++;
    k->launches++;
    k->m.g_accesses += m->g_accesses, k->m.g_sectors += m->g_sectors, k->m.g_ideal += m->g_ideal;
    k->m.s_accesses += m->s_accesses, k->m.s_ways += m->s_ways, k->m.s_conflicted += m->s_conflicted;
    if (m->s_ways_max > k->m.s_ways_max) k->m.s_ways_max = m->s_ways_max;
}

/* One run of the launch in `order` from the arena's bytes; its results stay in L's
 * mappings. observe: its memory accesses measured (one run of each launch is). */
static int run_once(RtBackend *b, Launch *L, int32_t i, int reverse, int observe)
{
    void *argv[MAX_ARGS];
    EmuRange global[MAX_ARGS];
    EmuMeasure m = {0};
    for (int g = 0; g < L->n_groups; g++) {
        if (group_map(b, &L->groups[g])) return failf(b, "cannot map a launch's arguments");
        global[g] = (EmuRange){L->groups[g].data, L->groups[g].data + L->groups[g].data_bytes};
    }
    for (int a = 0; a < L->n_args; a++) {
        const Group *g = &L->groups[L->group_of[a]];
        argv[a] = g->data + g->start + (L->lo[a] - g->lo);
    }
    struct sigaction sa = {.sa_sigaction = on_fault, .sa_flags = SA_SIGINFO}, old_segv, old_bus, old_abrt;
    sigemptyset(&sa.sa_mask);
    faulting = L;
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
    sigaction(SIGABRT, &sa, &old_abrt);
    char why[1024] = "";
    EmuLaunchArgs la = {.tramp = b->tramp[i], .args = argv, .nargs = L->n_args, .grid = L->c->grid,
                        .block = L->c->block, .smem = L->c->smem, .reverse = reverse, .global = global,
                        .n_global = L->n_groups, .measure = observe ? &m : NULL, .err = why, .errlen = sizeof why};
    int rc = b->mod.launch(&la);
    sigaction(SIGSEGV, &old_segv, NULL);
    sigaction(SIGBUS, &old_bus, NULL);
    sigaction(SIGABRT, &old_abrt, NULL);
    faulting = NULL;
    if (rc) return failf(b, "kernel %s (%s order): %s", plan_str(b->plan, L->c->kernel), reverse ? "reverse" : "forward", why);
    if (observe) add_measure(b, L->c->kernel, &m);
    for (int g = 0; g < L->n_groups; g++)
        if (check_canaries(b, L, &L->groups[g])) return -1;
    return 0;
}

static int launch(RtBackend *b, int32_t i)
{
    const PlanCuda *c = &b->plan->cuda[i];
    Launch first = {.b = b, .c = c, .n_args = c->n_args}, second;
    if (c->n_args > MAX_ARGS) return failf(b, "a launch of %d arguments (the emulator takes %d)", c->n_args, MAX_ARGS);
    for (int a = 0; a < c->n_args; a++) {
        first.lo[a] = b->s.args[b->s.arg_at[i] + a];
        first.hi[a] = first.lo[a] + plan_tensor_nbytes(&b->plan->tensors[b->plan->ids[c->args + a]]);
    }
    make_groups(&first);
    if (check_aliasing(b, &first, &b->params[i])) return -1;
    second = first;
    int rc = 0;
    if (b->order & ORDER_FORWARD) rc = run_once(b, &first, i, 0, 1);
    Launch *result = b->order & ORDER_FORWARD ? &first : &second;
    if (!rc && (b->order & ORDER_REVERSE)) rc = run_once(b, &second, i, 1, !(b->order & ORDER_FORWARD));
    for (int g = 0; g < first.n_groups && !rc && b->order == (ORDER_FORWARD | ORDER_REVERSE); g++) {
        const Group *g1 = &first.groups[g], *g2 = &second.groups[g];
        size_t n = (size_t)(g1->hi - g1->lo);
        if (!memcmp(g1->data + g1->start, g2->data + g2->start, n)) continue;
        size_t at = 0;
        while (g1->data[g1->start + at] == g2->data[g2->start + at]) at++;
        char an[200];
        rc = failf(b, "kernel %s gives different bytes when its threads run in reverse order (a race): %s, byte %lld",
                   plan_str(b->plan, c->kernel), arg_name(&first, arg_at(&first, g1->lo + (int64_t)at), an, sizeof an),
                   (long long)(g1->lo + (int64_t)at - first.lo[arg_at(&first, g1->lo + (int64_t)at)]));
    }
    for (int g = 0; g < result->n_groups && !rc; g++)
        memcpy(b->arena + result->groups[g].lo, result->groups[g].data + result->groups[g].start,
               (size_t)(result->groups[g].hi - result->groups[g].lo));
    for (int g = 0; g < first.n_groups; g++) group_free(&first.groups[g]), group_free(&second.groups[g]);
    return rc;
}

/* ---- GEMM: cublasGemmStridedBatchedEx, column-major, CUBLAS_COMPUTE_32F ---------------- */

float emu_load(const uint8_t *base, PlanDType t, int64_t i)
{
    uint16_t h;
    uint32_t u;
    float f;
    switch (t) {
    case PLAN_DT_F32: memcpy(&f, base + 4 * i, 4); return f;
    case PLAN_DT_BF16:
        memcpy(&h, base + 2 * i, 2);
        u = (uint32_t)h << 16;
        memcpy(&f, &u, 4);
        return f;
    case PLAN_DT_F16: {
        memcpy(&h, base + 2 * i, 2);
        int e = (h >> 10) & 31, m = h & 1023;
        float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m + 1024), e - 25);
        return h & 0x8000 ? -v : v;
    }
    default: return NAN;
    }
}

/* f32 to a 16-bit dtype, to nearest even (NaN stays NaN): what cuBLAS writes. */
void emu_store(uint8_t *base, PlanDType t, int64_t i, float v)
{
    uint32_t u;
    uint16_t h;
    memcpy(&u, &v, 4);
    if (t == PLAN_DT_F32) {
        memcpy(base + 4 * i, &v, 4);
        return;
    }
    if (t == PLAN_DT_BF16) {
        h = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u) : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    } else {
        uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu, r;
        if (a > 0x7f800000u) r = 0x7e00u;
        else if (a >= 0x477ff000u) r = 0x7c00u;
        else if (a < 0x38800000u) {  // subnormal: scale so the FPU rounds at the last place
            float s;
            memcpy(&s, &a, 4);
            s = s * 0x1p24f + 0x1p23f;
            memcpy(&r, &s, 4);
            r -= 0x4b000000u;
        } else {
            r = a - 0x38000000u;
            r = (r + 0x0fffu + ((r >> 13) & 1u)) >> 13;
        }
        h = (uint16_t)(sign | r);
    }
    memcpy(base + 2 * i, &h, 2);
}

/* Bytes [lo, hi) an operand of rows x cols (column-major, leading dimension ld) spans
 * over the batch; empty when any extent is 0. */
static void span(int64_t base, int64_t es, int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t batch,
                 int64_t *lo, int64_t *hi)
{
    *lo = *hi = base;
    if (rows <= 0 || cols <= 0 || batch <= 0) return;
    int64_t last = (rows - 1) + (cols - 1) * ld + (batch - 1) * stride, first = stride < 0 ? (batch - 1) * stride : 0;
    *lo = base + first * es;
    *hi = base + (last + 1) * es;
}

/* ---- cuBLASLt's epilogues (cublasLtMatmul, CUBLAS_COMPUTE_32F), on the f32 accumulator
 * plus cuBLASLt's C under beta 1 (alpha A B + beta C, then the epilogue's bias), rounded
 * once to D's dtype; column-major like the GEMM: the bias runs along m (one per row of C), aux is [m, n] with leading dim ldc. GELU is the tanh form. A bias gradient
 * sums in f32, in index order: DGELU_BGRAD C as stored over its columns, BGRADA op(A)
 * over k, BGRADB op(B) over k. (cuBLASLt sums in an order of its own, and may sum the
 * gradient before rounding it; the results agree to the sums' rounding.) */

static float gelu_tanh(float x) { return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x))); }

static float gelu_tanh_grad(float x)
{
    float u = 0.7978845608f * (x + 0.044715f * x * x * x), t = tanhf(u);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);
}

/* What cuBLASLt refuses for these epilogues (CUBLAS_STATUS_NOT_SUPPORTED or no algorithm):
 * a batch, a bias gradient of a transposed A or an untransposed B. (The CUDA backend makes
 * one call with no batch for a GEMM that adds a residual as C, beta 1, too.) */
static int lt_check(RtBackend *b, int32_t i, const CsGemm *g)
{
    if (g->batch != 1)
        return failf(b, "GEMM %d: epilogue %d on a batch of %d (this backend runs one call)", i, g->epilogue, g->batch);
    if ((g->epilogue == CS_EPI_BGRADA && g->trans_a) || (g->epilogue == CS_EPI_BGRADB && !g->trans_b))
        return failf(b, "GEMM %d: BGRADA needs A untransposed, BGRADB B transposed (cuBLASLt: not supported)", i);
    return 0;
}

static float lt_epilogue(RtBackend *b, const CsGemm *g, int64_t row, int64_t col, float acc)
{
    const uint8_t *bias = b->arena + g->bias, *aux = b->arena + g->aux;
    switch (g->epilogue) {
    case CS_EPI_BIAS: return acc + emu_load(bias, g->c_dt, row);
    case CS_EPI_GELU_AUX_BIAS: {
        float pre = acc + emu_load(bias, g->c_dt, row);
        emu_store(b->arena + g->aux, g->c_dt, row + col * g->ldc, pre);
        return gelu_tanh(pre);
    }
    case CS_EPI_DGELU_BGRAD: return acc * gelu_tanh_grad(emu_load(aux, g->c_dt, row + col * g->ldc));
    default: return acc;
    }
}

static void lt_bias_grad(RtBackend *b, const CsGemm *g)
{
    const uint8_t *A = b->arena + g->a, *B = b->arena + g->b, *C = b->arena + g->c;
    int64_t len = g->epilogue == CS_EPI_BGRADB ? g->n : g->m;
    for (int64_t j = 0; j < len; j++) {
        float s = 0.0f;
        if (g->epilogue == CS_EPI_DGELU_BGRAD)
            for (int64_t col = 0; col < g->n; col++) s += emu_load(C, g->c_dt, j + col * g->ldc);
        else if (g->epilogue == CS_EPI_BGRADA)
            for (int64_t l = 0; l < g->k; l++) s += emu_load(A, g->a_dt, g->trans_a ? l + j * g->lda : j + l * g->lda);
        else
            for (int64_t l = 0; l < g->k; l++) s += emu_load(B, g->b_dt, g->trans_b ? j + l * g->ldb : l + j * g->ldb);
        emu_store(b->arena + g->bias, g->c_dt, j, s);
    }
}

static int gemm(RtBackend *b, int32_t i)
{
    const Plan *p = b->plan;
    const PlanCuda *c = &p->cuda[i];
    const CsGemm *g = &b->s.gemms[i];
    /* cuBLAS's A is the plan's B, its B the plan's A (schedule.h). */
    int32_t ta = p->ids[c->args + 1], tb = p->ids[c->args], tc = p->ids[c->args + 2];
    int64_t ea = plan_dtype_size(g->a_dt), eb = plan_dtype_size(g->b_dt), ec = plan_dtype_size(g->c_dt);
    int64_t ar = g->trans_a ? g->k : g->m, ac = g->trans_a ? g->m : g->k;
    int64_t br = g->trans_b ? g->n : g->k, bc = g->trans_b ? g->k : g->n;
    if (g->m < 0 || g->n < 0 || g->k < 0 || g->batch < 0)
        return failf(b, "GEMM %d: m %d n %d k %d batch %d (cuBLAS: CUBLAS_STATUS_INVALID_VALUE)", i, g->m, g->n, g->k, g->batch);
    if (g->lda < (ar > 1 ? ar : 1) || g->ldb < (br > 1 ? br : 1) || g->ldc < (g->m > 1 ? g->m : 1))
        return failf(b, "GEMM %d: lda %d ldb %d ldc %d for a %lldx%lld A, %lldx%lld B, %dx%d C (cuBLAS: "
                     "CUBLAS_STATUS_INVALID_VALUE)", i, g->lda, g->ldb, g->ldc, (long long)ar, (long long)ac,
                     (long long)br, (long long)bc, g->m, g->n);
    if (g->a_dt != g->b_dt || (g->c_dt != g->a_dt && g->c_dt != PLAN_DT_F32) || g->a_dt == PLAN_DT_I32)
        return failf(b, "GEMM %d: A %s, B %s, C %s with CUBLAS_COMPUTE_32F (cuBLAS: CUBLAS_STATUS_NOT_SUPPORTED)", i,
                     plan_dtype_name(g->a_dt), plan_dtype_name(g->b_dt), plan_dtype_name(g->c_dt));
    int64_t k_eff = g->m && g->n ? g->k : 0;  // cuBLAS reads no operand when C is empty
    int64_t lo[3], hi[3];
    span(g->a, ea, k_eff ? ar : 0, ac, g->lda, g->stride_a, g->batch, &lo[0], &hi[0]);
    span(g->b, eb, k_eff ? br : 0, bc, g->ldb, g->stride_b, g->batch, &lo[1], &hi[1]);
    span(g->c, ec, g->m, g->n, g->ldc, g->stride_c, g->batch, &lo[2], &hi[2]);
    const int32_t ids[3] = {ta, tb, tc};
    static const char *const names[3] = {"A", "B", "C"};
    for (int o = 0; o < 3; o++) {
        int64_t t_lo = cs_offset(p, ids[o], b->s.vrank), t_hi = t_lo + plan_tensor_nbytes(&p->tensors[ids[o]]);
        if (lo[o] < hi[o] && (lo[o] < t_lo || hi[o] > t_hi))
            return failf(b, "GEMM %d: cuBLAS's %s spans arena bytes [%lld, %lld), outside its tensor %d at [%lld, %lld)", i,
                         names[o], (long long)lo[o], (long long)hi[o], ids[o], (long long)t_lo, (long long)t_hi);
    }
    for (int o = 0; o < 2; o++)
        if (lo[o] < hi[2] && lo[2] < hi[o])
            return failf(b, "GEMM %d: C overlaps cuBLAS's %s (undefined in cuBLAS)", i, names[o]);
    if ((g->epilogue != CS_EPI_DEFAULT || g->beta) && lt_check(b, i, g)) return -1;
    if (g->beta) {  // cuBLASLt's C: read beside D, never D's bytes (an in-place C would alias what is written)
        int64_t r_lo, r_hi;
        int32_t tr = p->ids[c->args + c->n_args - 1];
        int64_t t_lo = cs_offset(p, tr, b->s.vrank), t_hi = t_lo + plan_tensor_nbytes(&p->tensors[tr]);
        span(g->r, ec, g->m, g->n, g->ldc, 0, 1, &r_lo, &r_hi);
        if (r_lo < t_lo || r_hi > t_hi) return failf(b, "GEMM %d: its C (beta 1) spans outside its tensor %d", i, tr);
        if (r_lo < hi[2] && lo[2] < r_hi) return failf(b, "GEMM %d: its C (beta 1) overlaps its D", i);
    }
    const uint8_t *A = b->arena + g->a, *B = b->arena + g->b, *R = b->arena + g->r;
    uint8_t *C = b->arena + g->c;
    for (int64_t bi = 0; bi < g->batch; bi++)
        for (int64_t col = 0; col < g->n; col++)
            for (int64_t row = 0; row < g->m; row++) {
                float acc = 0.0f;
                for (int64_t l = 0; l < g->k; l++) {
                    int64_t ia = bi * g->stride_a + (g->trans_a ? l + row * g->lda : row + l * g->lda);
                    int64_t ib = bi * g->stride_b + (g->trans_b ? col + l * g->ldb : l + col * g->ldb);
                    acc += emu_load(A, g->a_dt, ia) * emu_load(B, g->b_dt, ib);
                }
                if (g->beta) acc += emu_load(R, g->c_dt, row + col * g->ldc);  // alpha AB + beta C, then the epilogue
                if (g->epilogue != CS_EPI_DEFAULT) acc = lt_epilogue(b, g, row, col, acc);
                emu_store(C, g->c_dt, bi * g->stride_c + row + col * g->ldc, acc);
            }
    if (g->epilogue == CS_EPI_DGELU_BGRAD || g->epilogue == CS_EPI_BGRADA || g->epilogue == CS_EPI_BGRADB)
        lt_bias_grad(b, g);
    return 0;
}

/* ---- ops ------------------------------------------------------------------------------ */

static int collective(RtBackend *b, const CsColl *c)
{
    if (c->in != c->out) memmove(b->arena + c->out, b->arena + c->in, (size_t)c->in_bytes);
    return 0;
}

/* Offload's copy between the arena and the host space. */
static void copy(RtBackend *b, const CsCopy *c)
{
    if (c->to_device)
        memcpy(b->arena + c->dev, b->host + c->host, (size_t)c->bytes);
    else
        memcpy(b->host + c->host, b->arena + c->dev, (size_t)c->bytes);
    *(c->to_device ? &b->to_device : &b->to_host) += c->bytes;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* Op k's work: its waits, its collective, copy or instructions, and (with host) its
 * host work, which a captured step runs as a node of its own. */
static int run_op(RtBackend *b, int32_t k, int host)
{
    const CsOp *o = &b->s.ops[k];
    char why[1024];
    for (int32_t w = o->wait; w < o->wait + o->n_wait; w++)
        if (b->s.waits[w] < b->s.n_colls && emu_nccl_wait(b->nccl, b->s.waits[w], why, sizeof why))
            return failf(b, "%s", why);
    if (o->coll >= 0 && b->s.colls[o->coll].async && emu_nccl_start(b->nccl, o->coll, why, sizeof why))
        return failf(b, "%s", why);
    if (o->coll >= 0 && !b->s.colls[o->coll].async && collective(b, &b->s.colls[o->coll])) return -1;
    if (o->copy >= 0) copy(b, &b->s.copies[o->copy]);
    if (host && o->host && b->host_op(b->host_ctx, k)) return failf(b, "the host could not run it");
    for (int32_t i = o->instr; i < o->instr + o->n_instr; i++)
        if (b->plan->cuda[i].kind == PLAN_CU_GEMM ? gemm(b, i) : launch(b, i)) return -1;
    return 0;
}

/* spans: each op timed on the host, as the CUDA backend times it with events on its
 * stream (here every stream is the calling thread); NULL: not timed. */
static int run_timed(RtBackend *b, int32_t from, int32_t to, RtSpan *spans)
{
    if (from < 0 || to > b->s.n_ops || from > to)
        return failf(b, "ops [%d, %d) outside the plan's %d", from, to, b->s.n_ops);
    double t0 = spans ? now_us() : 0;
    char why[1024];
    for (int32_t k = from; k < to; k++) {
        b->cur_op = k;
        if (spans) spans[k].start = now_us() - t0;
        if (run_op(b, k, 1)) return -1;
        if (spans) spans[k].dur = now_us() - t0 - spans[k].start;
    }
    b->cur_op = -1;
    if (b->nccl && emu_nccl_wait_all(b->nccl, why, sizeof why)) return failf(b, "%s", why);
    return 0;
}

static int run_ops(RtBackend *b, int32_t from, int32_t to) { return run_timed(b, from, to, NULL); }

/* ---- --cuda-graph: capture (graph.c) and replay -------------------------------------- */

static int graph_op(void *ctx, int32_t k) { return run_op(ctx, k, 0); }

static int replay(RtBackend *b)
{
    char why[1024];
    int32_t failed;
    int rc = emu_graph_replay(b->graph, graph_op, b, &failed);
    if (rc && failed >= 0) {
        b->cur_op = failed;
        return failf(b, "the host could not run it (a host function node of the step's graph)");
    }
    b->cur_op = -1;
    if (rc) return -1;
    if (b->nccl && emu_nccl_wait_all(b->nccl, why, sizeof why)) return failf(b, "%s", why);
    return 0;
}

static int run_step(RtBackend *b, int graph)
{
    if (!graph) return run_timed(b, 0, b->s.n_ops, NULL);
    if (!b->graph && !(b->graph = emu_graph_capture(&b->s, b->host_op, b->host_ctx)))
        return failf(b, "out of memory capturing the step");
    return replay(b);
}

static int run_step_timed(RtBackend *b, RtSpan *spans) { return run_timed(b, 0, b->s.n_ops, spans); }

/* ---- the table ------------------------------------------------------------------------ */

static int probe(char *err, size_t errlen)
{
    (void)err, (void)errlen;
    return 0;  // a C++ compiler is all it needs; create says when it is missing
}

static void destroy(RtBackend *b)
{
    if (!b) return;
    emu_nccl_free(b->nccl);
    emu_module_close(&b->mod);
    cs_free(&b->s);
    free(b->tramp);
    free(b->params);
    free(b->measured);
    free(b->table);
    free(b->arena);
    emu_graph_free(b->graph);
    free(b);
}

/* The parameters of kernel `name` as its definition in the module text declares them:
 * "KNAME(const float *__restrict__ x, __half *y)". -1 when it cannot be found. */
static int parse_params(const char *source, const char *name, Params *pr)
{
    size_t n = strlen(name);
    const char *at = source;
    *pr = (Params){0};
    while ((at = strstr(at, name)) && (at[n] != '(' || (at > source && at[-1] != ' '))) at += n;
    if (!at) return -1;
    at += n + 1;
    for (int i = 0; *at && *at != ')' && i < 64; i++) {
        const char *end = at + strcspn(at, ",)");
        while (*at == ' ' || *at == '\n') at++;
        if (!strncmp(at, "const ", 6)) pr->konst |= (uint64_t)1 << i;
        for (const char *r = at; (r = strstr(r, "__restrict__")) && r < end; r = end) pr->restrict_ |= (uint64_t)1 << i;
        at = *end == ',' ? end + 1 : end;
    }
    return *at == ')' ? 0 : -1;
}

/* The module, and every LAUNCH's trampoline checked against its args. */
static int bind_kernels(RtBackend *b)
{
    const Plan *p = b->plan;
    char why[2048];
    if (emu_module_load(p, &b->mod, why, sizeof why)) return failf(b, "%s", why);
    int launches = 0;
    for (int32_t i = 0; i < p->n_cuda; i++) {
        const PlanCuda *c = &p->cuda[i];
        if (c->kind != PLAN_CU_LAUNCH) continue;
        launches++;
        b->cur_op = c->op;
        if (!(b->tramp[i] = emu_module_kernel(&b->mod, plan_str(p, c->kernel))))
            return failf(b, "kernel %s is not in the plan's CUDA source", plan_str(p, c->kernel));
        if (b->tramp[i](NULL, c->n_args))
            return failf(b, "kernel %s does not take exactly %d pointers", plan_str(p, c->kernel), c->n_args);
        if (c->smem < 0 || c->smem > EMU_MAX_DYN_SHARED)
            return failf(b, "kernel %s: %d bytes of dynamic shared memory (a block has 0 to %d on sm_90)",
                         plan_str(p, c->kernel), c->smem, EMU_MAX_DYN_SHARED);
        if (parse_params(p->cuda_module, plan_str(p, c->kernel), &b->params[i]))
            return failf(b, "kernel %s: no definition found in the plan's CUDA source", plan_str(p, c->kernel));
    }
    b->cur_op = -1;
    if (b->mod.from_cache)
        snprintf(b->info.jit, sizeof b->info.jit, "%d launches, module from the cache (%.300s)", launches, b->mod.path);
    else
        snprintf(b->info.jit, sizeof b->info.jit, "%d launches, module compiled by %s in %.1f s", launches,
                 b->mod.compiler, b->mod.seconds);
    return 0;
}

static RtBackend *create(const RtBackendOptions *o, char *err, size_t errlen)
{
    RtBackend *b = calloc(1, sizeof *b);
    if (!b) {
        snprintf(err, errlen, "[rank %d] cuda-emu: out of memory", o->rank);
        return NULL;
    }
    const char *order = getenv("FS_CUDA_EMU_ORDER");
    b->plan = o->plan, b->rank = o->rank, b->cur_op = -1, b->page = sysconf(_SC_PAGESIZE);
    b->host = o->host_space, b->host_op = o->host_op, b->host_ctx = o->host_ctx;
    b->order = !order || !*order || !strcmp(order, "both") ? ORDER_FORWARD | ORDER_REVERSE
               : !strcmp(order, "reverse")                 ? ORDER_REVERSE
                                                           : ORDER_FORWARD;
    b->arena_bytes = plan_space_bytes(o->plan, PLAN_PLACE_DEVICE) > 0 ? plan_space_bytes(o->plan, PLAN_PLACE_DEVICE) : 0;
    char why[1024];
    int rc = 0, world = o->world > 0 ? o->world : 1, stages = o->stages > 1 ? o->stages : 1;
    if (world % stages || o->stage < 0 || o->stage >= stages)
        rc = failf(b, "stage %d of %d stages in a world of %d ranks", o->stage, stages, world);
    else if (order && *order && strcmp(order, "both") && strcmp(order, "forward") && strcmp(order, "reverse"))
        rc = failf(b, "FS_CUDA_EMU_ORDER=%s: forward, reverse or both", order);
    else if (!(b->arena = malloc(b->arena_bytes > 0 ? (size_t)b->arena_bytes : 1)) ||
             !(b->tramp = calloc((size_t)o->plan->n_cuda + 1, sizeof *b->tramp)) ||
             !(b->params = calloc((size_t)o->plan->n_cuda + 1, sizeof *b->params)) ||
             !(b->measured = calloc((size_t)o->plan->n_cuda + 1, sizeof *b->measured)))
        rc = failf(b, "out of memory");
    else if (cs_build_stage(o->plan, o->rank % (world / stages), world / stages, stages > 1 ? o->stage : 0, stages, &b->s,
                            why, sizeof why))
        rc = failf(b, "%s", why);
    else if ((b->s.n_copies || b->s.n_host) && (!b->host || !b->host_op || plan_space_bytes(o->plan, PLAN_PLACE_HOST) >
                                                                               o->host_space_bytes))
        rc = failf(b, "the plan has a host space (offload) of %lld bytes, but fsexec gave %lld and %s way to run its ops",
                   (long long)plan_space_bytes(o->plan, PLAN_PLACE_HOST), (long long)o->host_space_bytes,
                   o->host_op ? "a" : "no");
    if (!rc) {
        int64_t n = o->host_bytes < b->arena_bytes ? o->host_bytes : b->arena_bytes;
        if (b->arena_bytes > 0) memset(b->arena, 0xff, (size_t)b->arena_bytes);  // NaN where the step has not written
        if (n > 0) memcpy(b->arena, o->host_arena, (size_t)n);
        rc = bind_kernels(b);
        if (!rc && world > 1 && !(b->nccl = emu_nccl_new(&b->s, b->arena, o->rank, why, sizeof why)))
            rc = failf(b, "%s", why);
    }
    if (rc) {
        snprintf(err, errlen, "%s", b->err);
        destroy(b);
        return NULL;
    }
    snprintf(b->info.device, sizeof b->info.device, "cuda-emu (the kernels on the CPU, %s thread order%s)",
             b->order == (ORDER_FORWARD | ORDER_REVERSE) ? "forward and reverse" : b->order == ORDER_REVERSE ? "reverse" : "forward",
             b->order == (ORDER_FORWARD | ORDER_REVERSE) ? " compared" : "");
    b->info.arena_planned = b->info.arena = b->arena_bytes;
    b->info.blas_workspace = plan_meta_int(o->plan, "cuda_workspace_bytes", 0);
    b->info.used = b->arena_bytes;
    if (o->verbose) fprintf(stderr, "[rank %d] cuda-emu: %s\n", b->rank, b->info.jit);
    return b;
}

static int upload(RtBackend *b, int32_t id, const void *src)
{
    memcpy(b->arena + cs_offset(b->plan, id, b->s.vrank), src, (size_t)plan_tensor_nbytes(&b->plan->tensors[id]));
    return 0;
}

static int download(RtBackend *b, int32_t id, void *dst)
{
    memcpy(dst, b->arena + cs_offset(b->plan, id, b->s.vrank), (size_t)plan_tensor_nbytes(&b->plan->tensors[id]));
    return 0;
}

static int sync_all(RtBackend *b)
{
    (void)b;
    return 0;  // every launch is complete when it returns
}

static void info(const RtBackend *b, RtBackendInfo *out) { *out = b->info; }

static void copied(const RtBackend *b, int64_t *to_host, int64_t *to_device)
{
    *to_host = b->to_host, *to_device = b->to_device;
}

/* --timeout: the collective nccl_emu.c has in flight, named as the CUDA backend names it. */
static int hung(RtBackend *b, char *msg, size_t n)
{
    int32_t ci = b->nccl ? emu_nccl_hung(b->nccl) : -1;
    if (ci >= 0) cs_coll_describe(b->plan, &b->s, ci, msg, n);
    return ci >= 0;
}

static double ratio(long long a, long long b) { return b ? (double)a / (double)b : 0; }

/* Kernels by sectors per ideal, worst first. */
static int by_coalescing(const void *x, const void *y)
{
    const KernelMeasure *a = x, *b = y;
    double ra = ratio(a->m.g_sectors, a->m.g_ideal), rb = ratio(b->m.g_sectors, b->m.g_ideal);
    return ra < rb ? 1 : ra > rb ? -1 : b->m.s_ways_max - a->m.s_ways_max;
}

static const char *measures(RtBackend *b)
{
    const Plan *p = b->plan;
    int width = 6;
    for (int32_t k = 0; k < b->n_measured; k++) {
        int n = (int)strlen(plan_str(p, b->measured[k].kernel));
        width = n > width ? n : width;
    }
    size_t cap = 1024 + (size_t)b->n_measured * ((size_t)width + 120);
    free(b->table);
    if (!(b->table = malloc(cap))) return NULL;
    qsort(b->measured, (size_t)b->n_measured, sizeof *b->measured, by_coalescing);
    size_t at = (size_t)snprintf(b->table, cap,
                                 "cuda-emu measures, per kernel over its launches (tests/cuda_emu/emu_observe.hpp):\n"
                                 "  global: warp accesses to global memory; sectors: the 32-byte sectors they touched; "
                                 "ideal: the fewest that hold their bytes (sectors/ideal 1.00: coalesced)\n"
                                 "  shared: warp accesses to shared memory; ways: bank-conflict ways per access "
                                 "(1: none), average and worst; conflicted: accesses of more than 1 way\n"
                                 "%-*s %8s %10s %10s %10s %13s %10s %8s %5s %10s\n",
                                 width, "kernel", "launches", "global", "sectors", "ideal", "sectors/ideal", "shared",
                                 "ways", "worst", "conflicted");
    for (int32_t k = 0; k < b->n_measured && at < cap; k++) {
        const KernelMeasure *m = &b->measured[k];
        at += (size_t)snprintf(b->table + at, cap - at,
                               "%-*s %8d %10lld %10lld %10lld %13.2f %10lld %8.2f %5d %10lld\n",
                               width, plan_str(p, m->kernel), m->launches, m->m.g_accesses, m->m.g_sectors,
                               m->m.g_ideal, ratio(m->m.g_sectors, m->m.g_ideal), m->m.s_accesses,
                               ratio(m->m.s_ways, m->m.s_accesses), m->m.s_ways_max, m->m.s_conflicted);
    }
    return b->table;
}
static const char *error(const RtBackend *b) { return b->err; }

static const RtBackendOps OPS = {
    .abi = RT_BACKEND_ABI, .name = "cuda-emu", .probe = probe, .create = create, .destroy = destroy,
    .run_ops = run_ops, .run_step = run_step, .run_step_timed = run_step_timed, .upload = upload,
    .download = download, .sync = sync_all,
    .info = info, .error = error, .measures = measures, .copied = copied, .hung = hung,
};

__attribute__((visibility("default"))) const RtBackendOps *fs_cuda_backend(void);
const RtBackendOps *fs_cuda_backend(void) { return &OPS; }
