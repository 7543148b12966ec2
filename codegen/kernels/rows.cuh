// codegen/kernels/rows.cuh: the geometry of row kernels, which work on ROWS contiguous
// rows: one thread per row (FS_ROW_THREAD, 256 rows to a block), one warp per row
// (FS_ROW_WARP, 8 rows to a block of 256 threads) or one block per row (FS_ROW_BLOCK,
// NTR threads). codegen/cuda_rows.h chooses the kind and NTR for a shape; a kernel
// instantiates FsRow<KIND, NTR> and reduces across its row with FsRow::sum / ::max.
// Every thread of a row reaches every reduction (loops over the row are strided by NTR,
// never cut short), so block reductions are safe; warp rows past the last return
// together, a whole warp at a time (FsRow::past).
#pragma once
#include "prelude.cuh"

enum FsRowKind { FS_ROW_THREAD, FS_ROW_WARP, FS_ROW_BLOCK };

template <int KIND, int NTR_> struct FsRow {
    static constexpr int NTR = NTR_;  // threads per row
    long long row;                    // this thread's row
    int tid;                          // its index within the row, [0, NTR)

    __device__ __forceinline__ FsRow()
    {
        if constexpr (KIND == FS_ROW_BLOCK) {
            row = blockIdx.x, tid = threadIdx.x;
        } else {
            row = (long long)blockIdx.x * (256 / NTR) + threadIdx.x / NTR, tid = threadIdx.x % NTR;
        }
    }
    // A thread past the last row: it returns before any reduction (a whole warp does).
    __device__ __forceinline__ bool past(long long rows) const { return KIND != FS_ROW_BLOCK && row >= rows; }
    static __device__ __forceinline__ float sum(float v)
    {
        if constexpr (KIND == FS_ROW_BLOCK) return fs_block_sum(v);
        else if constexpr (KIND == FS_ROW_WARP) return fs_warp_sum(v);
        else return v;
    }
    static __device__ __forceinline__ float max(float v)
    {
        if constexpr (KIND == FS_ROW_BLOCK) return fs_block_max(v);
        else if constexpr (KIND == FS_ROW_WARP) return fs_warp_max(v);
        else return v;
    }
};
