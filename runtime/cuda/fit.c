/* runtime/cuda/fit.c: a plan's device memory against a device's free memory (fit.h).
 * Sizes in the message are MiB with one decimal, so two sizes a few MiB apart (143,333
 * against 143,156 MiB) read apart; the limit to recompile with is whole MiB, rounded
 * down, which fsc's --mem-limit takes as it is written.
 */
#include <inttypes.h>
#include <stdio.h>

#include "fit.h"

#define MIB ((int64_t)1 << 20)

/* A pipeline's largest stage: every rank asks before it knows its stage, and a stage
 * that does not fit ends every rank anyway (they agree). */
CudaNeed cuda_fit_need(const Plan *p)
{
    int64_t arena = 0;
    for (int32_t g = 0; g < p->n_programs; g++)
        if (p->programs[g].space_bytes[PLAN_PLACE_DEVICE] > arena) arena = p->programs[g].space_bytes[PLAN_PLACE_DEVICE];
    int64_t ws = plan_meta_int(p, "cuda_workspace_bytes", 32 << 20);
    return (CudaNeed){.arena = arena > 0 ? arena : 0, .workspace = ws > 0 ? ws : 0, .libraries = CUDA_FIT_LIBRARIES};
}

int64_t cuda_fit_total(const CudaNeed *n) { return n->arena + n->workspace + n->libraries; }

int cuda_fit_check(const CudaNeed *need, int64_t free_bytes, int64_t total, const char *device, char *msg, size_t n)
{
    int64_t want = cuda_fit_total(need);
    if (want <= free_bytes) return 0;
    int64_t room = free_bytes - need->workspace - need->libraries;
    int m = snprintf(msg, n, "the plan needs %.1f MiB of %s (arena %.1f MiB + cuBLAS workspace %.1f MiB + about "
                     "%.1f MiB for the kernels and cuBLAS), and it has %.1f MiB free of %.1f MiB: ", (double)want / MIB,
                     device,
                     (double)need->arena / MIB, (double)need->workspace / MIB, (double)need->libraries / MIB,
                     (double)free_bytes / MIB, (double)total / MIB);
    if (m < 0 || (size_t)m >= n) return -1;
    if (room >= MIB)
        snprintf(msg + m, n - (size_t)m, "recompile with fsc ... --mem-limit %" PRId64 "MiB (its what-ifs say which "
                 "settings fit), or free the device", room / MIB);
    else
        snprintf(msg + m, n - (size_t)m, "the device has no room for an arena; free it (another process holds its "
                 "memory) or run on a larger one");
    return -1;
}
