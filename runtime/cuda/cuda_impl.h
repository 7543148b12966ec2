/* runtime/cuda/cuda_impl.h: the CUDA backend's state and its check macros, shared by
 * backend.c (making and freeing it, moving tensors) and run.c (running ops).
 *
 * Invariants once made: the arena is one cuMemAlloc of the plan's arena_bytes holding
 * the same bytes at the same offsets as the host mirror did when it was made; every
 * LAUNCH has its function and its parameter pointers, every GEMM its cuBLAS form, every
 * collective its NCCL form and events (schedule.h); nothing is allocated after that
 * except the one graph capture that --cuda-graph asks for.
 *
 * Every CUDA, cuBLAS and NCCL call goes through a check macro: on failure it formats
 * `[rank r] runtime/cuda/FILE:LINE: call: STATUS: where` into b->err (where: the plan op
 * running, by index, name and source line, or the setup step) and returns -1 from the
 * calling function, which returns -1 in turn up to fsexec.
 */
#ifndef FS_CUDA_IMPL_H
#define FS_CUDA_IMPL_H

#include <string.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <nccl.h>

#include "backend.h"
#include "jit.h"
#include "ops.h"
#include "schedule.h"

struct CudaHostCall {
    struct RtBackend *b;
    int32_t op;
};

struct RtBackend {
    const Plan *plan;
    int rank, world, tf32, verbose;
    int stage, stages, dp, dp_rank;  // pipeline stage of stages; the data-parallel ranks of a stage, this one's index
    int sync_each;              // $FS_CUDA_SYNC=1: wait after every op, so a fault names its op
    CUdevice dev;
    int ordinal;
    CUcontext ctx;              // the device's primary context (retained), shared with cuBLAS and NCCL
    CUdeviceptr arena;          // arena_bytes, one allocation
    int64_t arena_bytes;
    CUstream compute, comm;     // comm: collectives over the stage's data-parallel ranks (world > 1)
    CUstream pipe;              // collectives over the pipeline (group 1), or NULL
    CUstream *link_stream;      // per pipeline link (CsSchedule.links): its sends or receives
    ncclComm_t *link_nccl;      // ... on a communicator of its two ranks, the sender 0
    CUstream copy;              // offload's copies between the arena and the host space
    CUmodule module;
    CUfunction *fn;             // per instruction (LAUNCH), resolved once
    CUdeviceptr *argv;          // per LAUNCH arg: its device pointer ...
    void **params;              // ... and cuLaunchKernel's pointer to it
    CsSchedule s;
    CUevent *ready, *done;      // per collective, then per copy (CsOp waits' numbering): compute
                                // reached it; NCCL (the copy) finished it
    CUevent *tev;               // --trace: per op its start and end on its stream, then the step's
                                // start (2 * n_ops + 1, timing events); NULL without
    int timing;                 // the run in progress records them (cuda_run_step_timed)
    cublasHandle_t blas;
    cublasLtHandle_t lt;        // the GEMMs with an epilogue (lt.c), NULL when the plan has none
    struct CudaLtGemm *lt_gemms;  // per instruction: an epilogue GEMM's descriptors and algorithm
    CUdeviceptr blas_ws;        // cuBLAS's workspace (cublasSetWorkspace)
    ncclComm_t nccl;
    ncclComm_t group_nccl[2];   // hybrid sharding's shard group and replica group (OP_GROUP_SHARD + k), or NULL
    ncclComm_t pipe_nccl;       // the stages at this data-parallel index (OP_GROUP_PIPE), or NULL
    volatile uint8_t *started;  // per collective: queued by the run in progress (--timeout's question)
    ncclRedOp_t *redop;         // per collective: its NCCL op (ncclSum, ncclAvg, or avg_over's premultiplied sum)
    CUgraphExec graph;          // the captured step (--cuda-graph)
    uint8_t *host;              // offload: the plan's host space (the mirror's), page-locked while the backend lives
    int64_t host_bytes;
    int host_locked;            // cuMemHostRegister took it
    int (*host_op)(void *ctx, int32_t op);  // runs an op of the host space on the host
    void *host_ctx;
    int64_t to_host, to_device; // the bytes offload's copies moved since the backend was made
    int idle;                   // nothing queued since the compute stream was last waited for
    /* --cuda-graph with offload (run.c): the host's ops as host-function nodes of the graph. */
    CUstream host_stream;       // they queue here, in plan order, NULL without host ops
    CUevent host_mark;          // the host stream's work so far (and the step's start, to fork it)
    struct CudaHostCall *host_calls;  // per op: its host function's argument
    int capturing;              // the run in progress is being captured (its copies are counted when replayed)
    int host_queued;            // capturing: host work queued since the copy stream last waited for it
    volatile int host_failed;   // a replayed host function whose op failed: the op + 1; 0
    int32_t cur_op;             // the op running, for messages; -1 outside ops
    const char *what;           // the setup step, for messages outside ops
    char what_buf[256];         // what points here when it needs formatting
    RtBackendInfo info;
    char err[2048];
};

/* ---- nccl.c: NCCL's functions, loaded for a world of more than one rank -------------- */

typedef struct {
    int loaded;
    ncclResult_t (*get_unique_id)(ncclUniqueId *id);
    ncclResult_t (*comm_init_rank)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
    ncclResult_t (*comm_destroy)(ncclComm_t comm);
    const char *(*get_error_string)(ncclResult_t r);
    const char *(*get_last_error)(ncclComm_t comm);
    ncclResult_t (*all_reduce)(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*reduce_scatter)(const void *send, void *recv, size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                                   ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*all_gather)(const void *send, void *recv, size_t sendcount, ncclDataType_t t, ncclComm_t comm,
                               cudaStream_t stream);
    ncclResult_t (*red_op_create_pre_mul_sum)(ncclRedOp_t *op, void *scalar, ncclDataType_t t,
                                              ncclScalarResidence_t residence, ncclComm_t comm);
    ncclResult_t (*red_op_destroy)(ncclRedOp_t op, ncclComm_t comm);
    ncclResult_t (*send)(const void *send, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                         cudaStream_t stream);
    ncclResult_t (*recv)(void *recv, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*comm_get_async_error)(ncclComm_t comm, ncclResult_t *async_error);
    ncclResult_t (*comm_abort)(ncclComm_t comm);
} NcclApi;
extern NcclApi nccl;
/* dlopen()s libnccl.so.2 ($FS_NCCL_LIB) once and fills `nccl`: 0, or -1 with why. */
int cuda_nccl_load(char *err, size_t errlen);

/* Formats the failure of `call` (its text; the name is what precedes the parenthesis)
 * with `status` into b->err; returns -1. */
int cuda_fail(RtBackend *b, const char *file, int line, const char *call, const char *status);
const char *cuda_status(CUresult r);     // "CUDA_ERROR_OUT_OF_MEMORY"
const char *nccl_status(RtBackend *b, ncclResult_t r);  // "ncclSystemError (... last error)"
/* The communicator of a collective's group (schedule.h: CsColl.group). */
static inline ncclComm_t cuda_comm_of(const RtBackend *b, int group)
{
    return group == OP_GROUP_SHARD ? b->group_nccl[0] : group == OP_GROUP_REPLICA ? b->group_nccl[1]
           : group == OP_GROUP_PIPE ? b->pipe_nccl : b->nccl;
}
ncclDataType_t cuda_nccl_type(PlanDType t);  // run.c

#define CU_CHECK(b, call)                                                                      \
    do {                                                                                       \
        CUresult r_ = (call);                                                                  \
        if (r_ != CUDA_SUCCESS) return cuda_fail((b), __FILE__, __LINE__, #call, cuda_status(r_)); \
    } while (0)

#define BLAS_CHECK(b, call)                                                                    \
    do {                                                                                       \
        cublasStatus_t r_ = (call);                                                            \
        if (r_ != CUBLAS_STATUS_SUCCESS)                                                       \
            return cuda_fail((b), __FILE__, __LINE__, #call, cublasGetStatusName(r_));         \
    } while (0)

#define NCCL_CHECK(b, call)                                                                    \
    do {                                                                                       \
        ncclResult_t r_ = (call);                                                              \
        if (r_ != ncclSuccess) return cuda_fail((b), __FILE__, __LINE__, #call, nccl_status((b), r_)); \
    } while (0)

/* ---- lt.c: GEMMs with an epilogue ----------------------------------------------- */

typedef struct CudaLtGemm CudaLtGemm;
int cuda_lt_make(RtBackend *b);            // after cuBLAS's workspace exists
void cuda_lt_free(RtBackend *b);
int cuda_lt_gemm(RtBackend *b, int32_t i);  // instruction i, on the compute stream

/* ---- run.c ------------------------------------------------------------------------- */

int cuda_run_ops(RtBackend *b, int32_t from, int32_t to);
int cuda_run_step(RtBackend *b, int graph);
int cuda_run_step_timed(RtBackend *b, RtSpan *spans);
int cuda_hung(RtBackend *b, char *msg, size_t n);

#endif
