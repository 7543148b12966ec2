/* runtime/backend.h: the table of functions a backend gives the step loop (step.c): the
 * CPU one (backend_cpu.c) or a device backend, and how fsexec finds one.
 *
 * The CPU executor (runtime/exec.c) always exists. For a device it is the HOST MIRROR:
 * it holds what the host reads or writes (memplan puts persistent state at the bottom of
 * the arena, so the mirror is that prefix, plus the step's outputs apart), initializes
 * params and optimizer state, the data loader writes each batch into it, and safetensors
 * save and load read and write it. A device backend (runtime/cuda/, built as
 * libfs_cuda.so) holds the whole arena, same offsets, on its device: it copies the
 * mirror's prefix up once when it is made, runs the plan's ops there, and moves single
 * tensors between the two when asked (each step's inputs up; the outputs the progress
 * line reads down; every persistent tensor down before weights are saved). Nothing else
 * in fsexec changes with the backend.
 *
 * The backend is a library loaded with dlopen() only when asked for (`--device cuda`
 * or `auto`), so fsexec itself links no GPU library and runs on a machine without a
 * driver. The library exports one symbol, RT_BACKEND_SYMBOL, a function returning the
 * table; its `abi` must equal RT_BACKEND_ABI (the loader checks), so a stale library
 * is refused instead of called through a wrong table.
 *
 * Errors: every function returns 0 or -1; after -1, `error` gives one line that starts
 * `[rank r] file:line: call: STATUS: ...` and names the plan op that was running, if
 * any. A backend never exits the process: fsexec's own error path ends every rank.
 */
#ifndef FS_RUNTIME_BACKEND_H
#define FS_RUNTIME_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"

#define RT_BACKEND_ABI 7
#define RT_BACKEND_SYMBOL "fs_cuda_backend"

typedef struct RtBackend RtBackend;
typedef struct Exec Exec;

/* One op's time in a traced step (fsexec --trace, runtime/trace.c): when it started on
 * its stream and how long it ran, in microseconds from the start of the step's call.
 * An op that computes nothing (a view) has a span of 0 where it was reached. */
typedef struct {
    double start, dur;  // µs
} RtSpan;

typedef struct {
    const Plan *plan;         // checked by plan_read; must outlive the backend
    const void *host_arena;   // the CPU Exec's arena (rt_exec_arena): copied up once ...
    int64_t host_bytes;       // ... its first host_bytes (a mirror holds the persistent prefix)
    int rank, world;          // this rank in the world and the world's ranks; world > 1: MPI is up (rt_comm_init)
    int stage, stages;        // the pipeline stage plan is the program of (plan_extract_program), of how
                              // many; the world is stages x data-parallel ranks, rank = stage * dp + index
    int local_rank;           // this rank's index on its machine; -1 when unknown
    int tf32;                 // f32 GEMMs may use TF32 tensor cores
    int verbose;              // say on stderr what setup does (compile, cache)
    Exec *exec;               // the host mirror (the CPU backend runs on it; CUDA ignores it)
    /* Offload: the plan's host space, which the mirror holds whole (copies go between it
     * and the device arena), and how to run an op that computes in it. host_op(host_ctx,
     * k) runs op k on the host; the backend calls it once all the device work before k
     * is complete, and queues nothing after k until it returns. */
    void *host_space;
    int64_t host_space_bytes; // 0: the plan has no host space
    int (*host_op)(void *ctx, int32_t op);
    void *host_ctx;
    int trace;                // some steps are timed (run_step_timed): make the timing events
} RtBackendOptions;

/* What a made backend took, for the start line and the memory report. Bytes are
 * measured as the device's free memory before and after each part was set up. */
typedef struct {
    char device[128];         // "cuda:0 NVIDIA H200 (sm_90)"
    char jit[400];            // "kernels: 41 compiled by NVRTC 13.0 in 1.2 s" / "... from cache"
    int64_t arena_planned;    // the plan's arena_bytes
    int64_t arena;            // what allocating it took
    int64_t context;          // the device context (total - free once it exists)
    int64_t module;           // the compiled kernels
    int64_t blas;             // the BLAS handle and its workspace
    int64_t blas_workspace;   // of which the workspace (meta "cuda_workspace_bytes")
    int64_t comm;             // the collective library's communicator (0 alone)
    int64_t used, total;      // the device's used and total memory once set up
} RtBackendInfo;

typedef struct {
    int abi;                  // RT_BACKEND_ABI
    const char *name;         // "cuda"
    /* Whether this machine can run the backend at all (driver, a device): 0, or -1
     * with why ("cuInit: CUDA_ERROR_NO_DEVICE"). Cheap; makes nothing. */
    int (*probe)(char *err, size_t errlen);
    /* Picks the device, copies the host arena up, compiles (or loads from the cache)
     * the plan's kernels, binds every instruction; with world > 1, every rank calls it
     * (the collective communicator is made together). NULL with a message. */
    RtBackend *(*create)(const RtBackendOptions *o, char *err, size_t errlen);
    void (*destroy)(RtBackend *b);
    /* Runs ops [from, to) of the plan in order; every collective is complete when it
     * returns. The device work may still be in flight: a download waits for it. */
    int (*run_ops)(RtBackend *b, int32_t from, int32_t to);
    /* The whole step. graph: capture it once as a device graph (on the first call that
     * asks), then replay the capture; the step's inputs live in the arena, so a replay
     * after uploads is the same step with new data. */
    int (*run_step)(RtBackend *b, int graph);
    /* The whole step, op by op (never as a graph), each op timed on its stream: spans[k]
     * for op k of the plan (every op, one each). Complete on return. */
    int (*run_step_timed)(RtBackend *b, RtSpan *spans);
    /* One tensor (this rank's bytes of it) between the device arena and host memory of
     * its size: upload from src, download into dst (complete on return). */
    int (*upload)(RtBackend *b, int32_t tensor, const void *src);
    int (*download)(RtBackend *b, int32_t tensor, void *dst);
    /* Waits for every launched piece of work; reports a fault of any of it. */
    int (*sync)(RtBackend *b);
    void (*info)(const RtBackend *b, RtBackendInfo *out);
    /* The message of the last failure. */
    const char *(*error)(const RtBackend *b);
    /* What the backend measured of the kernels it ran so far, as a table for people
     * (op_check prints it); NULL where it measures nothing. The CUDA backend: NULL; the
     * CPU emulator of tests/cuda_emu: each kernel's global-memory sectors per warp access
     * against the fewest possible, and its shared-memory bank conflicts. */
    const char *(*measures)(RtBackend *b);
    /* Whether plan p's device memory fits in what the device of local_rank has free,
     * asked before fsexec builds anything for it: 0 (also when it cannot tell), or -1
     * with what is free, what the plan needs and the fsc --mem-limit to recompile with.
     * Keeps nothing. NULL: the backend runs in host memory and has nothing to check. */
    int (*check_fit)(const Plan *p, int local_rank, char *err, size_t errlen);
    /* The bytes offload's copies between the arena and the host space moved since the
     * backend was made (--log's to_host_bytes, to_device_bytes), counted as each step
     * queues them. NULL: the backend runs the copies on the Exec, which counts them. */
    void (*copied)(const RtBackend *b, int64_t *to_host, int64_t *to_device);
    /* --timeout on a device: called from fsexec's watchdog thread once a step has run past
     * its deadline (the main thread is blocked in the backend, waiting for the device).
     * Names the first collective, send or receive of the run that started and has not
     * completed, and the ranks it waits for (schedule.h: cs_coll_describe), with NCCL's
     * asynchronous error if it has one (ncclCommGetAsyncError); then aborts NCCL's
     * communicators (ncclCommAbort), so no stream waits on them for ever. 1 with the text
     * in msg, 0 when none is in flight. NULL: the backend has nothing to say. */
    int (*hung)(RtBackend *b, char *msg, size_t n);
} RtBackendOps;

typedef const RtBackendOps *(*RtBackendEntry)(void);

/* ---- runtime/backend_cpu.c ---------------------------------------------------------- */

/* The CPU backend: the Exec of RtBackendOptions.exec runs the steps on the host mirror. */
const RtBackendOps *rt_backend_cpu(void);

/* ---- runtime/backend.c: finding and loading a backend ------------------------------ */

/* The CUDA backend: $FS_CUDA_BACKEND, else libfs_cuda.so next to this executable
 * (/proc/self/exe), loaded with dlopen. NULL with why: the library is missing (this
 * build has no CUDA backend), or it cannot be loaded ("libcuda.so.1: cannot open
 * shared object file: ...": no driver), or its table is stale. The library stays loaded
 * for the life of the process. */
const RtBackendOps *rt_backend_load_cuda(char *err, size_t errlen);
/* Whether a plan carries a CUDA program (fsc made it with the CUDA codegen): 0, or -1
 * with "this plan has no CUDA program; recompile it with this fsc". */
int rt_backend_plan_has_cuda(const Plan *p, char *err, size_t errlen);

#endif
