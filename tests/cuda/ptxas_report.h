/* tests/cuda/ptxas_report.h: what ptxas says of each kernel it compiles for sm_90 (NVRTC
 * with --ptxas-options=-v), and the blocks of a launch an SM of an H100 / H200 can hold,
 * for tests/cuda/nvrtc_compile.c's report of every sample's kernels.
 */
#ifndef FS_PTXAS_REPORT_H
#define FS_PTXAS_REPORT_H

#include <stdio.h>

typedef struct {
    char name[128];          // the entry function: the kernel's extern "C" name
    int regs;                // registers per thread
    int spill_stores, spill_loads;  // bytes
    int stack;               // bytes of stack frame per thread
    int smem;                // bytes of static shared memory
    int barriers;
    int threads, dyn_smem;   // its largest launch in the plans: threads per block, dynamic shared bytes
} PtxasKernel;

/* Appends the entry functions of an NVRTC log of a compile with ptxas -v to *k (grown with
 * realloc; *n of them). Returns how many it found, or -1 when out of memory or a line
 * it should read is not as ptxas 12-13 writes it. */
int ptxas_parse(const char *log, PtxasKernel **k, int *n);
/* Blocks of k's largest launch one sm_90 SM holds at once (by threads, registers and
 * shared memory); 0 when it cannot run at all. */
int ptxas_blocks_per_sm(const PtxasKernel *k);
/* Every kernel (regs, spills, stack, shared memory, its launch, blocks per SM), by name;
 * then the top 10 by spill bytes (those that spill) and by registers. */
void ptxas_print(PtxasKernel *k, int n, FILE *out);

#endif
