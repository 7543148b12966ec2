/* runtime/cuda/fit.h: whether a plan fits on a device, before fsexec builds anything for
 * it. Pure: the device's free memory is an argument, so it is tested on machines
 * without a GPU (tests/cuda/test_cuda_fit.c); the backend (backend.c, check_fit) asks
 * the driver and calls it before the host mirror, the data or the kernels are made.
 */
#ifndef FS_CUDA_FIT_H
#define FS_CUDA_FIT_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"

/* What a rank of the plan takes on its device beside the context (which the free memory
 * is measured after): the arena, cuBLAS's workspace, and an allowance for the kernels'
 * module and cuBLAS's handle. NCCL's buffers (world > 1) are made later and are not
 * counted: a plan within them of the limit still fails there, with NCCL's message. */
typedef struct {
    int64_t arena;      // the plan's device space (program 0's, per rank)
    int64_t workspace;  // meta "cuda_workspace_bytes" (32 MiB by default)
    int64_t libraries;  // CUDA_FIT_LIBRARIES
} CudaNeed;

#define CUDA_FIT_LIBRARIES ((int64_t)64 << 20)

CudaNeed cuda_fit_need(const Plan *p);
int64_t cuda_fit_total(const CudaNeed *n);

/* 0 when `need` fits in free_bytes (of total, on `device`: "cuda:0 NVIDIA H200"); else -1
 * and msg says what is free, what the plan needs, part by part, and the fsc --mem-limit
 * to recompile with: the free bytes less all but the arena, in whole MiB. */
int cuda_fit_check(const CudaNeed *need, int64_t free_bytes, int64_t total, const char *device, char *msg, size_t n);

#endif
