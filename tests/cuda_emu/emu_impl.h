/* tests/cuda_emu/emu_impl.h: the cuda-emu test backend's parts, shared by backend.c (the
 * RtBackendOps table, launches, GEMMs, collectives) and module.c (the plan's kernels
 * compiled as C++ and loaded).
 *
 * cuda-emu is test infrastructure: a library, libfs_cudaemu.so, that exports the same
 * table as the CUDA backend (runtime/backend.h) so tests/cuda/op_check.c, unchanged,
 * checks every op of a plan against the CPU backend with FS_CUDA_BACKEND pointing at it.
 * It runs the plan's real CUDA source (meta "cuda_source") in the emulator of emu.hpp,
 * and each GEMM as the cuBLAS call runtime/cuda/schedule.c derives for it.
 */
#ifndef FS_CUDA_EMU_IMPL_H
#define FS_CUDA_EMU_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "emu_abi.h"
#include "plan.h"
#include "schedule.h"  // runtime/cuda/schedule.h: CsSchedule

typedef struct {
    void *so;             // dlopen handle of the compiled module
    EmuLaunch launch;
    int from_cache;       // the module was compiled by an earlier run
    double seconds;       // compiling it took
    char compiler[96];    // the command: "c++ -std=c++17 -O1"
    char path[1024];      // the .so
    char cpp[1024];       // the translation unit it was compiled from
} EmuModule;

/* ---- backend.c: elements as cuBLAS (and NCCL) read and write them ------------------- */

/* Element i of an f32, bf16 or f16 array, as f32 (NaN for another dtype). */
float emu_load(const uint8_t *base, PlanDType t, int64_t i);
/* v stored as element i, rounded to nearest even (NaN stays NaN). */
void emu_store(uint8_t *base, PlanDType t, int64_t i, float v);

/* ---- module.c ------------------------------------------------------------------------- */

/* Compiles the plan's CUDA source (with emu.hpp and a trampoline for every kernel its
 * LAUNCHes name) into a shared library in the cache directory ($FS_CUDA_EMU_CACHE, else
 * $TMPDIR/fs_cudaemu-UID), named by the hash of everything that goes into it, unless it
 * is there already; then loads it. The compiler is $FS_CUDA_EMU_CXX, else c++.
 * 0, or -1 with a message (the compiler's first lines when it fails). */
int emu_module_load(const Plan *p, EmuModule *m, char *err, size_t errlen);
/* The trampoline of kernel `name`, or NULL. */
EmuTramp emu_module_kernel(const EmuModule *m, const char *name);
void emu_module_close(EmuModule *m);

/* ---- graph.c: --cuda-graph's capture and replay --------------------------------------- */

typedef struct EmuGraph EmuGraph;
/* The step of schedule s as the CUDA backend captures it, each op of the host space a host
 * function node that calls host_op(host_ctx, op); NULL when out of memory. */
EmuGraph *emu_graph_capture(const CsSchedule *s, int (*host_op)(void *ctx, int32_t op), void *host_ctx);
/* Runs the captured step: each device op through run_op(ctx, op), each host node's
 * function; -1 when one fails (a host op: its op in *failed_op, else -1). */
int emu_graph_replay(EmuGraph *g, int (*run_op)(void *ctx, int32_t op), void *ctx, int32_t *failed_op);
void emu_graph_free(EmuGraph *g);

#endif
