/* tests/cuda/ptxas_report.c: ptxas's verbose report (tests/cuda/ptxas_report.h), read from
 * an NVRTC log. For each entry function ptxas 12-13 writes
 *
 *   ptxas info    : Compiling entry function 'NAME' for 'sm_90'
 *   ptxas info    : Function properties for NAME
 *   ptxas         .     S bytes stack frame, T bytes spill stores, L bytes spill loads
 *   ptxas info    : Used R registers, used B barriers[, M bytes smem][, C bytes cmem[0]]
 *
 * (properties of called device functions come between, under their own names, and are
 * skipped). Blocks per SM follow the CUDA occupancy rules of compute capability 9.0:
 * at most 32 blocks and 2048 threads (64 warps) an SM; 65536 registers, given to warps
 * in units of 256; 228 KiB of shared memory, of which a block takes its static and
 * dynamic bytes rounded up to 128, plus 1 KiB the system reserves per block.
 */
#include "ptxas_report.h"

#include <stdlib.h>
#include <string.h>

enum {
    SM_BLOCKS = 32, SM_WARPS = 64, SM_REGS = 65536, REG_UNIT = 256, SM_SMEM = 228 * 1024, SMEM_UNIT = 128,
    SMEM_RESERVED = 1024, TOP = 10
};

static const char *line_end(const char *s)
{
    const char *e = strchr(s, '\n');
    return e ? e : s + strlen(s);
}

/* The NAME of "... 'NAME' ..." or "... for NAME" on the line at s (ending at e), into buf. */
static int name_at(const char *from, const char *e, char *buf, size_t n)
{
    const char *q = from;
    if (*q == '\'') q++;
    size_t len = 0;
    while (q + len < e && q[len] != '\'' && q[len] != '\r') len++;
    if (!len || len >= n) return -1;
    memcpy(buf, q, len);
    buf[len] = 0;
    return 0;
}

int ptxas_parse(const char *log, PtxasKernel **k, int *n)
{
    int found = 0, in_props = 0;
    PtxasKernel *cur = NULL;
    for (const char *s = log; *s; s = *line_end(s) ? line_end(s) + 1 : line_end(s)) {
        const char *e = line_end(s), *m;
        char name[128];
        if ((m = strstr(s, "Compiling entry function '")) && m < e) {
            PtxasKernel *grown = realloc(*k, sizeof **k * (size_t)(*n + 1));
            if (!grown) return -1;
            *k = grown;
            cur = &grown[(*n)++];
            *cur = (PtxasKernel){.regs = -1};
            if (name_at(m + strlen("Compiling entry function "), e, cur->name, sizeof cur->name)) return -1;
            found++, in_props = 0;
        } else if ((m = strstr(s, "Function properties for ")) && m < e) {
            in_props = cur && !name_at(m + strlen("Function properties for "), e, name, sizeof name) &&
                       !strcmp(name, cur->name);
        } else if ((m = strstr(s, "bytes stack frame")) && m < e) {
            const char *dot = strchr(s, '.');
            if (in_props && (!dot || dot > m ||
                             sscanf(dot + 1, "%d bytes stack frame, %d bytes spill stores, %d bytes spill loads",
                                    &cur->stack, &cur->spill_stores, &cur->spill_loads) != 3))
                return -1;
            in_props = 0;
        } else if ((m = strstr(s, "Used ")) && m < e && cur && cur->regs < 0) {
            if (sscanf(m, "Used %d registers, used %d barriers", &cur->regs, &cur->barriers) != 2) return -1;
            const char *sm = strstr(m, "bytes smem");
            if (sm && sm < e) {
                while (sm > m && sm[-1] == ' ') sm--;
                while (sm > m && sm[-1] >= '0' && sm[-1] <= '9') sm--;
                cur->smem = atoi(sm);
            }
        }
    }
    for (int i = *n - found; i < *n; i++)
        if ((*k)[i].regs < 0) return -1;
    return found;
}

static int round_up(int x, int unit) { return (x + unit - 1) / unit * unit; }

int ptxas_blocks_per_sm(const PtxasKernel *k)
{
    int threads = k->threads > 0 ? k->threads : 1, warps = (threads + 31) / 32;
    int blocks = SM_BLOCKS;
    if (SM_WARPS / warps < blocks) blocks = SM_WARPS / warps;
    int warp_regs = round_up((k->regs > 0 ? k->regs : 1) * 32, REG_UNIT);
    if (SM_REGS / warp_regs / warps < blocks) blocks = SM_REGS / warp_regs / warps;
    int smem = k->smem + k->dyn_smem;
    if (smem > 0 && SM_SMEM / (round_up(smem, SMEM_UNIT) + SMEM_RESERVED) < blocks)
        blocks = SM_SMEM / (round_up(smem, SMEM_UNIT) + SMEM_RESERVED);
    return blocks;
}

static void print_one(const PtxasKernel *k, FILE *out)
{
    fprintf(out, "  %-40s %4d %7d %7d %6d %7d %8d %6d %5d\n", k->name, k->regs, k->spill_stores, k->spill_loads,
            k->stack, k->smem, k->dyn_smem, k->threads, ptxas_blocks_per_sm(k));
}

static void header(const char *title, FILE *out)
{
    fprintf(out, "%s\n  %-40s %4s %7s %7s %6s %7s %8s %6s %5s\n", title, "kernel", "regs", "spill st", "spill ld",
            "stack", "smem", "dyn smem", "threads", "blk/SM");
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const PtxasKernel *)a)->name, ((const PtxasKernel *)b)->name);
}

static int by_spills(const void *a, const void *b)
{
    const PtxasKernel *x = a, *y = b;
    int sx = x->spill_stores + x->spill_loads, sy = y->spill_stores + y->spill_loads;
    return sx != sy ? (sx < sy ? 1 : -1) : by_name(a, b);
}

static int by_regs(const void *a, const void *b)
{
    const PtxasKernel *x = a, *y = b;
    return x->regs != y->regs ? (x->regs < y->regs ? 1 : -1) : by_name(a, b);
}

void ptxas_print(PtxasKernel *k, int n, FILE *out)
{
    qsort(k, (size_t)n, sizeof *k, by_name);
    header("ptxas -v for sm_90, every kernel (bytes; threads and dynamic shared memory of its largest launch; "
           "blocks per SM an H100/H200 SM holds):", out);
    for (int i = 0; i < n; i++) print_one(&k[i], out);
    int spilling = 0;
    for (int i = 0; i < n; i++) spilling += k[i].spill_stores + k[i].spill_loads > 0;
    qsort(k, (size_t)n, sizeof *k, by_spills);
    fprintf(out, "%d of %d kernels spill registers to local memory\n", spilling, n);
    if (spilling) header("the top 10 by spill bytes (stores + loads):", out);
    for (int i = 0; i < spilling && i < TOP; i++) print_one(&k[i], out);
    qsort(k, (size_t)n, sizeof *k, by_regs);
    header("the top 10 by registers:", out);
    for (int i = 0; i < n && i < TOP; i++) print_one(&k[i], out);
    qsort(k, (size_t)n, sizeof *k, by_name);
}
