/* codegen/cuda_embed.c: CUDA launches of embedding, embedding_bwd, rope, rope_at and rope_rows; the
 * kernels are codegen/kernels/embed.cuh's templates, instantiated with the shapes, dtypes
 * and flags. Semantics are runtime/cpu/embed.c's and attention.c's (rope).
 *
 * embedding(table [V, C], idx [...]) -> [..., C]: one thread per output element copies
 * its element of the table (the same dtype: no rounding).
 *
 * embedding_bwd(idx [N...], dy [N..., C], rows = V) -> dtable [V, C]: zeros, then dy's
 * rows added at idx, without atomics. A block owns EB_ROWS = 32 rows of the table and
 * EB_COLS = 256 columns, accumulating them in shared memory (32 KiB), and scans all N
 * indices in tiles of 256, adding each tile's matches in index order (the template's
 * comment says how). So every element sums its dy rows in index order, as on the CPU.
 * Cost: every block reads every index, N * V * C / (EB_ROWS * EB_COLS) index reads in all
 * (L2-resident: the indices are small), plus dy once. embedding_bwd_into(acc, idx, dy)
 * is the same kernel starting from acc's elements (its output lies on acc) instead of 0.
 *
 * rope(x [..., T, D], theta, inverse, interleaved): the pair (i, i + D/2) (interleaved:
 * (2i, 2i + 1)) of the row at position t turns by t * theta^(-2i/D) (backwards under
 * inverse); rope_at(x, pos, ...) the same
 * with row t at position pos[0] + t, read from the i32 pos on the device. A thread takes
 * one (t, i) and computes the angle in f64 as the CPU does, then turns that pair in every
 * slice of blockIdx.y's share of the leading dims (at most ROPE_SPLIT blocks down them).
 * rope_rows(x [..., T, n D], n, ...) is rope on Llama's projection rows (passes/packed_attn.c): the
 * same kernel with each of a row's n heads a slice.
 *
 * An index outside [0, V) is a broken plan or bad data: the kernel traps (the launch
 * fails and the runtime reports it) rather than read or write out of bounds.
 *
 * Where it sits: called by codegen_cuda (cuda_program.c) through the op table.
 */
#include "cuda_rows.h"

enum { EB_ROWS = 32, EB_COLS = 256 };  // embedding_bwd: table rows x columns per block
enum { ROPE_SPLIT = 64 };               // rope: blocks down the leading dims, at most

/* embedding(table, idx) -> out */
int cuda_embedding(CuCtx *c)
{
    const Value *t = cu_inv(c, 0), *idx = cu_inv(c, 1);
    if (t->rank != 2 || !dtype_is_float(t->dtype) || idx->dtype != DT_I32 || cu_outv(c, 0)->dtype != t->dtype)
        return cu_fail(c, "embedding: a float [V, C] table and i32 indices only");
    int64_t V = t->shape[0], C = t->shape[1], n = ir_numel(idx);
    cu_use(c, "embed.cuh");
    const char *src = cu_kernel(
        c, 0, cu_fmt(c, "%s, %s, %s", cu_pin(c, 0, "table"), cu_pin(c, 1, "idx"), cu_pout(c, 0, "out")),
        cu_fmt(c, "fs_embedding<%lldLL, %lldLL, %lldLL>(table, idx, out)", (long long)(n * C), (long long)V,
               (long long)C));
    CuDim grid;
    if (cu_grid1(c, cu_cdiv(n * C, 256), &grid)) return -1;
    return cu_launch(c, "embedding", src, grid, (CuDim){256, 1, 1}, 0,
                     (int[]){cu_in_id(c, 0), cu_in_id(c, 1), cu_out_id(c, 0)}, 3);
}

/* dtable [V, C] (out_id) from indices and dy (inputs ia, ia + 1): zeros first, or (into)
 * its own elements (file comment). */
static int embedding_bwd(CuCtx *c, const char *op, int ia, int out_id, int into)
{
    const Value *idx = cu_inv(c, ia), *o = cu_outv(c, 0);
    if (idx->dtype != DT_I32 || !dtype_is_float(cu_inv(c, ia + 1)->dtype) || o->rank != 2)
        return cu_fail(c, "%s: i32 indices and float gradients only", op);
    int64_t V = o->shape[0], C = o->shape[1], n = ir_numel(idx);
    if (n > INT_MAX) return cu_fail(c, "%s: %lld indices, more than %d", op, (long long)n, INT_MAX);
    cu_use(c, "embed.cuh");
    const char *src = cu_kernel(
        c, EB_COLS, cu_fmt(c, "%s, %s, %s", cu_pin(c, ia, "idx"), cu_pin(c, ia + 1, "dy"), cu_pout(c, 0, "out")),
        cu_fmt(c, "%s<%d, %lldLL, %lldLL, %lldLL>(idx, dy, out)", into ? "fs_embedding_bwd_into" : "fs_embedding_bwd",
               EB_ROWS, (long long)n, (long long)V, (long long)C));
    CuDim grid;
    if (cu_grid1(c, cu_cdiv(V, EB_ROWS) * cu_cdiv(C, EB_COLS), &grid)) return -1;
    return cu_launch(c, op, src, grid, (CuDim){EB_COLS, 1, 1}, 0, (int[]){cu_in_id(c, ia), cu_in_id(c, ia + 1), out_id},
                     3);
}

/* embedding_bwd(idx, dy, rows) -> dtable (file comment) */
int cuda_embedding_bwd(CuCtx *c) { return embedding_bwd(c, "embedding_bwd", 0, cu_out_id(c, 0), 0); }

/* embedding_bwd_into(acc, idx, dy) -> acc plus dy's rows at idx, in acc's bytes: the kernel's
 * out is acc (input 0, read and written), as the roofline report reads it. */
int cuda_embedding_bwd_into(CuCtx *c) { return embedding_bwd(c, "embedding_bwd_into", 1, cu_in_id(c, 0), 1); }

/* rope(x, theta, inverse) -> y, rope_at(x, pos, theta, inverse) -> y with row t at position pos[0] + t (at:
 * pos's input index, or -1), and rope_rows(x, n, ...) -> y, the rows' n heads each turned (file comment) */
static int rope(CuCtx *c, const char *op, int at, int64_t n)
{
    const Value *x = cu_inv(c, 0);
    if (!dtype_is_float(x->dtype) || x->rank < 2 || n < 1 || x->shape[x->rank - 1] % (2 * n))
        return cu_fail(c, "%s: a float [..., T, n D] input with D even only", op);
    int64_t T = x->shape[x->rank - 2], D = x->shape[x->rank - 1] / n, outer = ir_numel(x) / (T * D);
    double theta = ir_attr_float(c->g, cu_node(c), "theta", 10000);
    int inverse = ir_attr_int(c->g, cu_node(c), "inverse", 0) != 0;
    int interleaved = ir_attr_int(c->g, cu_node(c), "interleaved", 0) != 0;
    int split = outer < ROPE_SPLIT ? (int)outer : ROPE_SPLIT;
    cu_use(c, "embed.cuh");
    const char *pos = at < 0 ? "" : cu_fmt(c, "%s, ", cu_pin(c, at, "pos"));
    const char *src = cu_kernel(c, 0, cu_fmt(c, "%s, %s%s", cu_pin(c, 0, "x"), pos, cu_pout(c, 0, "y")),
                                cu_fmt(c, "fs_rope<%s, %s, %s, %lldLL, %d, %lldLL, %lldLL, %lldLL>(x, %s, y, %s)",
                                       at < 0 ? "false" : "true", inverse ? "true" : "false",
                                       interleaved ? "true" : "false", (long long)outer, split, (long long)T,
                                       (long long)D, (long long)n, at < 0 ? "nullptr" : "pos", cu_double(c, theta)));
    CuDim grid;
    if (cu_grid1(c, cu_cdiv(T * (D / 2), 256), &grid)) return -1;
    grid.y = split;
    int args[3] = {cu_in_id(c, 0), at < 0 ? cu_out_id(c, 0) : cu_in_id(c, at), cu_out_id(c, 0)};
    return cu_launch(c, op, src, grid, (CuDim){256, 1, 1}, 0, args, at < 0 ? 2 : 3);
}

int cuda_rope(CuCtx *c) { return rope(c, "rope", -1, 1); }

int cuda_rope_at(CuCtx *c)
{
    if (cu_inv(c, 1)->dtype != DT_I32 || ir_numel(cu_inv(c, 1)) != 1) return cu_fail(c, "rope_at: an i32 [1] pos only");
    return rope(c, "rope_at", 1, 1);
}

int cuda_rope_rows(CuCtx *c) { return rope(c, "rope_rows", -1, ir_attr_int(c->g, cu_node(c), "n", 1)); }
