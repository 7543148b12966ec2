/* runtime/batch.h: runs of a CPU rank's ops that the executor (exec.c) runs as one
 * parallel region each (runtime/batch.c). Private to the runtime. */
#ifndef FS_RT_BATCH_H
#define FS_RT_BATCH_H

#include "kernels.h"
#include "plan.h"

typedef struct RtBatches RtBatches;

/* The batches of ops [0, n_ops) of plan p: call[k] and fn[k] are op k's bound call (which
 * must outlive the result) and kernel, may[k] whether op k may join one (a kernel
 * call: not a view, a collective or a copy). NULL when there are none, or out of
 * memory (the ops then run one by one, which is always correct). */
RtBatches *rt_batches_new(const Plan *p, const KCall *const *call, const CpuKernel *fn, const unsigned char *may);
void rt_batches_free(RtBatches *b);
/* The ops in the batch that starts at op k (it runs k to k + len - 1), or 0. */
int32_t rt_batch_len(const RtBatches *b, int32_t k);
/* Runs the batch that starts at op k: the same bits as its ops run one by one. */
void rt_batch_run(RtBatches *b, int32_t k);

#endif
