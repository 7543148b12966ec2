/* codegen/cuda_rows.h: what the emitters of reductions, norms, the loss, lookups,
 * attention and layouts (cuda_reduce.c, cuda_norm.c, cuda_loss.c, cuda_embed.c,
 * cuda_attention.c, cuda_layout.c) share, and nothing else includes: axes, views around an
 * axis, grids, and the geometry of row kernels.
 *
 * A row kernel works on `rows` contiguous rows of `n` elements: one warp per row when
 * rows are short (eight rows to a block of 256 threads), else one block per row (or,
 * for rows of a few elements, one thread per row, 256 rows to a block). Its
 * text starts with row_head, which defines `row` (long long), `tid` (the thread's
 * index within its row) and `NTR` (threads per row), and reduces across a row with
 * the prelude's fs_warp_* or fs_block_* as RowGeo.sum / RowGeo.max name them. Every
 * thread of a row reaches every reduction (loops over the row are strided by NTR,
 * never cut short), so block reductions are safe; warp rows past the last return
 * together, a whole warp at a time.
 */
#ifndef FS_CUDA_ROWS_H
#define FS_CUDA_ROWS_H

#include <limits.h>

#include "cuda.h"

/* axis in [-rank, rank) to [0, rank); -1 when out of range. */
static inline int cu_axis(int64_t axis, int rank)
{
    int64_t a = axis < 0 ? axis + rank : axis;
    return a >= 0 && a < rank ? (int)a : -1;
}

/* x viewed around one axis as (outer, n, inner). */
static inline void cu_around(const Value *x, int axis, int64_t *outer, int64_t *n, int64_t *inner)
{
    *outer = 1, *inner = 1;
    for (int d = 0; d < axis; d++) *outer *= x->shape[d];
    for (int d = axis + 1; d < x->rank; d++) *inner *= x->shape[d];
    *n = x->shape[axis];
}

static inline int64_t cu_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* A 1-D grid of `blocks` blocks of `threads`; -1 (cu_fail) beyond CUDA's grid limit. */
static inline int cu_grid1(CuCtx *c, int64_t blocks, CuDim *grid)
{
    if (blocks < 1 || blocks > INT_MAX) return cu_fail(c, "%lld blocks exceed CUDA's grid limit", (long long)blocks);
    *grid = (CuDim){(int)blocks, 1, 1};
    return 0;
}

enum { ROW_WARP_MAX = 1024, ROWS_PER_BLOCK = 8, ROW_THREAD_BLOCK = 256 };
typedef enum { ROW_THREAD, ROW_WARP, ROW_BLOCK } RowKind;

typedef struct {
    RowKind kind;
    int threads;            // per row (NTR)
    int block;              // threads per block
    int64_t blocks;
    const char *sum, *max;  // the prelude's reductions over a row's threads ("": one thread)
} RowGeo;

/* One warp per row of up to ROW_WARP_MAX elements, else one block. */
static inline RowGeo row_geo(int64_t rows, int64_t n)
{
    if (n <= ROW_WARP_MAX)
        return (RowGeo){ROW_WARP, 32, 32 * ROWS_PER_BLOCK, cu_cdiv(rows, ROWS_PER_BLOCK), "fs_warp_sum", "fs_warp_max"};
    int t = n <= 8192 ? 256 : n <= 32768 ? 512 : 1024;
    return (RowGeo){ROW_BLOCK, t, t, rows, "fs_block_sum", "fs_block_max"};
}

/* One thread per row: for rows too short to share. */
static inline RowGeo row_geo_thread(int64_t rows)
{
    return (RowGeo){ROW_THREAD, 1, ROW_THREAD_BLOCK, cu_cdiv(rows, ROW_THREAD_BLOCK), "", ""};
}

/* The opening lines of a row kernel's body (see the file comment). */
static inline char *row_head(CuCtx *c, const RowGeo *g, int64_t rows)
{
    if (g->kind == ROW_BLOCK)
        return cu_fmt(c,
                      "    const long long row = blockIdx.x;\n"
                      "    const int tid = threadIdx.x;\n"
                      "    const int NTR = %d;\n",
                      g->threads);
    int per = g->kind == ROW_WARP ? ROWS_PER_BLOCK : ROW_THREAD_BLOCK;
    return cu_fmt(c,
                  "    const long long row = (long long)blockIdx.x * %d + threadIdx.x / %d;\n"
                  "    if (row >= %lldLL) return;\n"
                  "    const int tid = threadIdx.x %% %d;\n"
                  "    const int NTR = %d;\n",
                  per, g->threads, (long long)rows, g->threads, g->threads);
}

/* A row template's first two arguments (codegen/kernels/rows.cuh): "FS_ROW_WARP, 32". */
static inline char *row_targs(CuCtx *c, const RowGeo *g)
{
    static const char *const KIND[] = {"FS_ROW_THREAD", "FS_ROW_WARP", "FS_ROW_BLOCK"};
    return cu_fmt(c, "%s, %d", KIND[g->kind], g->threads);
}

static inline int row_launch(CuCtx *c, const char *prefix, const char *src, const RowGeo *g, const int *args, int n_args)
{
    CuDim grid;
    if (cu_grid1(c, g->blocks, &grid)) return -1;
    return cu_launch(c, prefix, src, grid, (CuDim){g->block, 1, 1}, 0, args, n_args);
}

#endif
